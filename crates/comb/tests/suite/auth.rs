//! Bearer tokens against a real server: every route class with each role, tokens that must be
//! refused (expired, not yet valid, `alg: none`, wrong key, wrong issuer), keys from a public
//! key and from a key set that rotates, queue scopes, and the producer's identity on messages.

use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::common::{self, Env};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use reqwest::StatusCode;
use reqwest::header::HeaderMap;
use serde_json::{Value, json};

pub(super) const SECRET: &str = "a-test-secret-of-more-than-32-bytes!";
const ISSUER: &str = "https://idp.test/";
const AUDIENCE: &str = "comb-tests";

pub(super) fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// Claims of a token valid for an hour from now.
pub(super) fn claims(sub: &str, role: &str) -> Value {
    json!({"sub": sub, "role": role, "iss": ISSUER, "aud": AUDIENCE, "exp": now() + 3600,
           "iat": now()})
}

pub(super) fn hs256(claims: &Value) -> String {
    sign(
        Header::new(Algorithm::HS256),
        claims,
        &EncodingKey::from_secret(SECRET.as_bytes()),
    )
}

fn sign(header: Header, claims: &Value, key: &EncodingKey) -> String {
    jsonwebtoken::encode(&header, claims, key).unwrap()
}

/// An answer: status, headers and body text.
pub(super) struct Answer {
    pub(super) status: StatusCode,
    headers: HeaderMap,
    pub(super) text: String,
}

impl Answer {
    pub(super) fn json(&self) -> Value {
        serde_json::from_str(&self.text).unwrap_or(Value::Null)
    }
}

async fn call(
    env: &Env,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<Value>,
) -> Answer {
    let mut req = env.http.request(method.parse().unwrap(), env.url(path));
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    if let Some(b) = body {
        req = req.json(&b);
    }
    let r = req.send().await.expect("request");
    Answer {
        status: r.status(),
        headers: r.headers().clone(),
        text: r.text().await.unwrap(),
    }
}

/// Sends a request and asserts its status; the answer, for further checks.
pub(super) async fn expect(
    env: &Env,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<Value>,
    want: StatusCode,
) -> Answer {
    let a = call(env, method, path, token, body).await;
    assert_eq!(a.status, want, "{method} {path}: {}", a.text);
    a
}

/// Sends a request and asserts a 403 problem with `code`.
async fn refused(
    env: &Env,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<Value>,
    code: &str,
) {
    assert_forbidden(&call(env, method, path, token, body).await, code);
}

/// Asserts a 401 problem with a bearer challenge that echoes nothing of the token.
fn assert_unauthorized(a: &Answer, token: Option<&str>) {
    assert_eq!(a.status, StatusCode::UNAUTHORIZED, "{}", a.text);
    let challenge = a.headers["www-authenticate"].to_str().unwrap();
    assert!(challenge.starts_with("Bearer "), "{challenge}");
    assert_eq!(a.headers["content-type"], "application/problem+json");
    let body = a.json();
    assert!(
        body["code"] == "missing_token" || body["code"] == "invalid_token",
        "{body}"
    );
    if let Some(t) = token {
        for part in t.split('.').filter(|p| p.len() > 4) {
            assert!(
                !a.text.contains(part),
                "the answer echoes the token: {}",
                a.text
            );
        }
        assert!(!a.text.contains("mallory"), "the answer echoes a claim");
    }
}

fn assert_forbidden(a: &Answer, code: &str) {
    assert_eq!(a.status, StatusCode::FORBIDDEN, "{}", a.text);
    assert_eq!(a.headers["content-type"], "application/problem+json");
    assert_eq!(a.json()["code"], code, "{}", a.text);
}

/// The flags of a server that takes HS256 tokens signed with [`SECRET`].
pub(super) const HS256_ARGS: &[&str] = &[
    "--jwt-enabled",
    "--jwt-secret",
    SECRET,
    "--jwt-issuer",
    ISSUER,
    "--jwt-audience",
    AUDIENCE,
];

pub(super) async fn hs256_server(extra: &[&str]) -> Env {
    let mut args = HS256_ARGS.to_vec();
    args.extend_from_slice(extra);
    Env::start_with(&args).await
}

/// Pushes `items` with `token` (asserting 201), then pops `pop` with it (asserting 200): the
/// pop's answer.
pub(super) async fn push_then_pop(env: &Env, token: &str, items: Value, pop: &str) -> Value {
    expect(
        env,
        "POST",
        "/api/v1/push",
        Some(token),
        Some(json!({ "items": items })),
        StatusCode::CREATED,
    )
    .await;
    expect(env, "GET", pop, Some(token), None, StatusCode::OK)
        .await
        .json()
}

fn push_body(queue: &str, n: usize) -> Value {
    let items: Vec<Value> = (0..n)
        .map(|i| json!({"queue": queue, "payload": {"n": i}, "producerSub": "mallory"}))
        .collect();
    json!({ "items": items })
}

#[tokio::test]
async fn every_route_class_needs_its_role() {
    let env = hs256_server(&[]).await;
    let reader = hs256(&claims("reader", "read-only"));
    let writer = hs256(&claims("writer", "write-only"));
    let worker = hs256(&claims("worker", "read-write"));
    let admin = hs256(&claims("boss", "admin"));

    // Public: probes and metrics.
    for path in ["/health", "/ready", "/metrics"] {
        assert_eq!(
            call(&env, "GET", path, None, None).await.status,
            StatusCode::OK,
            "{path}"
        );
    }
    // No token: 401 everywhere else, unknown routes included.
    for (method, path) in [
        ("POST", "/api/v1/push"),
        ("GET", "/api/v1/pop/queue/q"),
        ("POST", "/api/v1/configure"),
        ("GET", "/api/v1/openapi.json"),
        ("DELETE", "/api/v1/resources/queues/q"),
        ("GET", "/no/such/route"),
        ("POST", "/no/such/route"),
    ] {
        let a = call(&env, method, path, None, Some(json!({}))).await;
        assert_unauthorized(&a, None);
        assert_eq!(a.json()["code"], "missing_token");
        // The body was left unread: the connection is not reused.
        assert_eq!(a.headers["connection"], "close");
    }
    // A scheme other than Bearer is no token.
    let basic = env
        .http
        .post(env.url("/api/v1/push"))
        .header("authorization", "Basic dXNlcjpwYXNz")
        .json(&push_body("q", 1))
        .send()
        .await
        .unwrap();
    assert_eq!(basic.status(), StatusCode::UNAUTHORIZED);

    // Reads: every role that reads.
    for t in [&reader, &worker, &admin] {
        expect(
            &env,
            "GET",
            "/api/v1/openapi.json",
            Some(t),
            None,
            StatusCode::OK,
        )
        .await;
    }
    refused(
        &env,
        "GET",
        "/api/v1/openapi.json",
        Some(&writer),
        None,
        "forbidden",
    )
    .await;

    // Pushes: write-only, read-write, admin; not read-only.
    refused(
        &env,
        "POST",
        "/api/v1/push",
        Some(&reader),
        Some(push_body("q", 1)),
        "forbidden",
    )
    .await;
    for t in [&writer, &worker, &admin] {
        expect(
            &env,
            "POST",
            "/api/v1/push",
            Some(t),
            Some(push_body("q", 1)),
            StatusCode::CREATED,
        )
        .await;
    }

    // Pops change state: not for readers or write-only producers.
    let consuming = [
        ("GET", "/api/v1/pop/queue/q", None),
        ("POST", "/api/v1/pop", Some(json!({"queue": "q"}))),
        ("POST", "/api/v1/ack", Some(json!({}))),
        ("POST", "/api/v1/transaction", Some(json!({}))),
        ("POST", "/api/v1/lease/x/extend", Some(json!({}))),
    ];
    for t in [&reader, &writer] {
        for (method, path, body) in &consuming {
            refused(&env, method, path, Some(t), body.clone(), "forbidden").await;
        }
    }
    let popped = call(
        &env,
        "GET",
        "/api/v1/pop/queue/q?batch=10",
        Some(&worker),
        None,
    )
    .await;
    assert_eq!(popped.status, StatusCode::OK, "{}", popped.text);
    let messages = popped.json()["messages"].as_array().unwrap().clone();
    assert_eq!(messages.len(), 3);
    // Who pushed each: the token's subject, whatever the body said.
    let subs: Vec<&str> = messages
        .iter()
        .map(|m| m["producerSub"].as_str().unwrap())
        .collect();
    assert_eq!(subs, ["writer", "worker", "boss"]);
    let acked = call(
        &env,
        "POST",
        "/api/v1/ack",
        Some(&worker),
        Some(json!({
            "transactionId": messages[0]["transactionId"],
            "partitionId": messages[0]["partitionId"],
            "leaseId": messages[0]["leaseId"],
            "status": "completed",
        })),
    )
    .await;
    assert_eq!(acked.status, StatusCode::OK, "{}", acked.text);

    // Administration: admin only.
    for t in [&reader, &writer, &worker] {
        refused(
            &env,
            "POST",
            "/api/v1/configure",
            Some(t),
            Some(json!({"queue": "q"})),
            "forbidden",
        )
        .await;
        refused(
            &env,
            "DELETE",
            "/api/v1/resources/queues/q",
            Some(t),
            None,
            "forbidden",
        )
        .await;
        // Unknown routes need an administrator, whatever their method but GET.
        refused(&env, "POST", "/no/such/route", Some(t), None, "forbidden").await;
    }
    expect(
        &env,
        "POST",
        "/api/v1/configure",
        Some(&admin),
        Some(json!({"queue": "q"})),
        StatusCode::OK,
    )
    .await;
    expect(
        &env,
        "POST",
        "/no/such/route",
        Some(&admin),
        None,
        StatusCode::NOT_FOUND,
    )
    .await;
    expect(
        &env,
        "DELETE",
        "/api/v1/resources/queues/q",
        Some(&admin),
        None,
        StatusCode::OK,
    )
    .await;

    // A token with no role this server knows may do nothing.
    let nobody = hs256(&claims("mallory", "superuser"));
    refused(
        &env,
        "GET",
        "/api/v1/openapi.json",
        Some(&nobody),
        None,
        "forbidden",
    )
    .await;
    // Roles may also come as an array claim.
    let mut c = claims("arrays", "none");
    c["roles"] = json!(["viewer", "read-write"]);
    expect(
        &env,
        "POST",
        "/api/v1/push",
        Some(&hs256(&c)),
        Some(push_body("q", 1)),
        StatusCode::CREATED,
    )
    .await;
}

#[tokio::test]
async fn tokens_that_must_not_pass_get_the_same_401() {
    let env = hs256_server(&[]).await;
    let good = claims("mallory", "admin");
    let path = "/api/v1/openapi.json";
    assert_eq!(
        call(&env, "GET", path, Some(&hs256(&good)), None)
            .await
            .status,
        StatusCode::OK
    );

    let mut expired = good.clone();
    expired["exp"] = json!(now() - 3600);
    let mut early = good.clone();
    early["nbf"] = json!(now() + 3600);
    let mut no_exp = good.clone();
    no_exp.as_object_mut().unwrap().remove("exp");
    let mut wrong_issuer = good.clone();
    wrong_issuer["iss"] = json!("https://evil.test/");
    let mut no_issuer = good.clone();
    no_issuer.as_object_mut().unwrap().remove("iss");
    let mut wrong_audience = good.clone();
    wrong_audience["aud"] = json!("someone-else");
    let wrong_key = sign(
        Header::new(Algorithm::HS256),
        &good,
        &EncodingKey::from_secret(b"another-secret-of-more-than-32-bytes"),
    );
    // `alg: none`, unsigned, with valid claims.
    let none = format!(
        "{}.{}.",
        URL_SAFE_NO_PAD.encode(br#"{"alg":"none","typ":"JWT"}"#),
        URL_SAFE_NO_PAD.encode(good.to_string())
    );
    // The right secret, but announced as another algorithm.
    let hs384 = sign(
        Header::new(Algorithm::HS384),
        &good,
        &EncodingKey::from_secret(SECRET.as_bytes()),
    );
    // A valid token with its payload swapped for another.
    let valid = hs256(&good);
    let parts: Vec<&str> = valid.split('.').collect();
    let mut promoted = good.clone();
    promoted["sub"] = json!("root");
    let tampered = format!(
        "{}.{}.{}",
        parts[0],
        URL_SAFE_NO_PAD.encode(promoted.to_string()),
        parts[2]
    );

    let mut bodies = Vec::new();
    for token in [
        hs256(&expired),
        hs256(&early),
        hs256(&no_exp),
        hs256(&wrong_issuer),
        hs256(&no_issuer),
        hs256(&wrong_audience),
        wrong_key,
        none,
        hs384,
        tampered,
        "not-a-token".to_string(),
        "a.b.c".to_string(),
    ] {
        let a = call(&env, "GET", path, Some(&token), None).await;
        assert_eq!(a.status, StatusCode::UNAUTHORIZED, "token {}", bodies.len());
        assert_unauthorized(&a, Some(&token));
        assert_eq!(a.json()["code"], "invalid_token");
        // Each answer has its own request id; the rest must not differ.
        let mut body = a.json();
        body.as_object_mut().unwrap().remove("requestId");
        bodies.push(body.to_string());
    }
    // Every refusal reads the same: a wrong signature is not told from a wrong issuer.
    assert!(bodies.windows(2).all(|w| w[0] == w[1]), "{bodies:?}");

    // Within the clock skew (30 s by default), a just-expired token still passes.
    let mut just_expired = good.clone();
    just_expired["exp"] = json!(now() - 5);
    expect(
        &env,
        "GET",
        path,
        Some(&hs256(&just_expired)),
        None,
        StatusCode::OK,
    )
    .await;
}

#[tokio::test]
async fn producer_identity_is_stored_on_every_push_path_and_cannot_be_forged() {
    let env = hs256_server(&[]).await;
    let alice = hs256(&claims("alice", "read-write"));
    // Small pushes (one statement), large ones (copied in), producer transaction ids (the
    // checked insert), and pushes inside a transaction.
    expect(
        &env,
        "POST",
        "/api/v1/push",
        Some(&alice),
        Some(push_body("small", 3)),
        StatusCode::CREATED,
    )
    .await;
    expect(
        &env,
        "POST",
        "/api/v1/push",
        Some(&alice),
        Some(push_body("large", 200)),
        StatusCode::CREATED,
    )
    .await;
    let items: Vec<Value> = (0..5)
        .map(|i| {
            json!({"queue": "ids", "transactionId": format!("t{i}"), "payload": i,
                        "producerSub": "mallory"})
        })
        .collect();
    expect(
        &env,
        "POST",
        "/api/v1/push",
        Some(&alice),
        Some(json!({"items": items})),
        StatusCode::CREATED,
    )
    .await;
    let bob = hs256(&claims("bob", "read-write"));
    expect(
        &env,
        "POST",
        "/api/v1/transaction",
        Some(&bob),
        Some(json!({"operations": [{"type": "push", "items": [
            {"queue": "tx", "payload": 1, "producerSub": "mallory"}]}]})),
        StatusCode::OK,
    )
    .await;

    for (queue, n, sub) in [
        ("small", 3, "alice"),
        ("large", 200, "alice"),
        ("ids", 5, "alice"),
        ("tx", 1, "bob"),
    ] {
        let a = expect(
            &env,
            "GET",
            &format!("/api/v1/pop/queue/{queue}?batch=1000&autoAck=true"),
            Some(&alice),
            None,
            StatusCode::OK,
        )
        .await;
        let messages = a.json()["messages"].as_array().unwrap().clone();
        assert_eq!(messages.len(), n, "{queue}");
        assert!(
            messages.iter().all(|m| m["producerSub"] == sub),
            "{queue}: {}",
            a.text
        );
    }
    assert_eq!(
        env.sql("SELECT count(*) FROM comb.messages WHERE producer_sub = 'mallory'"),
        "0"
    );
}

#[tokio::test]
async fn without_tokens_messages_carry_no_producer() {
    let env = Env::start().await;
    env.push(json!([{"queue": "q", "payload": 1, "producerSub": "mallory"}]))
        .await;
    let items: Vec<Value> = (0..100)
        .map(|i| json!({"queue": "q", "payload": i}))
        .collect();
    env.push(json!(items)).await;
    let messages = env
        .drain("/api/v1/pop/queue/q?batch=1000&autoAck=true")
        .await;
    assert_eq!(messages.len(), 101);
    assert!(messages.iter().all(|m| m.get("producerSub").is_none()));
    assert_eq!(
        env.sql("SELECT count(*) FROM comb.messages WHERE producer_sub IS NOT NULL"),
        "0"
    );
    // Listings say so (Queen's shape: the field is there, null).
    let (_, listed) = env.get("/api/v1/messages?queue=q&limit=5").await;
    let listed = listed["messages"].as_array().unwrap().clone();
    assert_eq!(listed.len(), 5);
    assert!(
        listed
            .iter()
            .all(|m| m.get("producerSub") == Some(&Value::Null))
    );
}

#[tokio::test]
async fn a_token_limited_to_queue_prefixes_touches_only_those() {
    let env = hs256_server(&["--jwt-queues-claim", "queues", "--jwt-protect-metrics"]).await;
    let mut c = claims("team-a", "admin");
    c["queues"] = json!(["a.", "shared"]);
    let scoped = hs256(&c);
    let mut c = claims("team-b", "read-write");
    c["queues"] = json!("b.");
    let b_only = hs256(&c);
    let unscoped = hs256(&claims("ops", "admin"));
    let push = |q: &str| json!({"items": [{"queue": q, "payload": 1}]});

    expect(
        &env,
        "POST",
        "/api/v1/push",
        Some(&scoped),
        Some(push("a.orders")),
        StatusCode::CREATED,
    )
    .await;
    expect(
        &env,
        "POST",
        "/api/v1/push",
        Some(&scoped),
        Some(push("shared")),
        StatusCode::CREATED,
    )
    .await;
    refused(
        &env,
        "POST",
        "/api/v1/push",
        Some(&scoped),
        Some(push("b.orders")),
        "queue_forbidden",
    )
    .await;
    // One item outside the scope fails the whole push; nothing of it is stored.
    let mixed = json!({"items": [{"queue": "a.x", "payload": 1}, {"queue": "b.x", "payload": 2}]});
    refused(
        &env,
        "POST",
        "/api/v1/push",
        Some(&scoped),
        Some(mixed),
        "queue_forbidden",
    )
    .await;
    assert_eq!(
        env.sql("SELECT count(*) FROM comb.queues WHERE name IN ('a.x', 'b.x')"),
        "0"
    );
    expect(
        &env,
        "POST",
        "/api/v1/push",
        Some(&b_only),
        Some(push("b.orders")),
        StatusCode::CREATED,
    )
    .await;

    // Pops by path and by body, pushes inside transactions, configuration and deletion:
    // (method, path, body, 403 code or the status wanted).
    let tx =
        |q: &str| json!({"operations": [{"type": "push", "items": [{"queue": q, "payload": 1}]}]});
    let queue = |q: &str| Some(json!({ "queue": q }));
    let cases = [
        (
            "GET",
            "/api/v1/pop/queue/b.orders",
            None,
            Err("queue_forbidden"),
        ),
        (
            "GET",
            "/api/v1/pop/queue/b%2Eorders",
            None,
            Err("queue_forbidden"),
        ),
        (
            "POST",
            "/api/v1/pop",
            queue("b.orders"),
            Err("queue_forbidden"),
        ),
        (
            "GET",
            "/api/v1/pop/queue/a.orders",
            None,
            Ok(StatusCode::OK),
        ),
        ("POST", "/api/v1/pop", queue("shared"), Ok(StatusCode::OK)),
        (
            "POST",
            "/api/v1/transaction",
            Some(tx("b.orders")),
            Err("queue_forbidden"),
        ),
        (
            "POST",
            "/api/v1/transaction",
            Some(tx("a.orders")),
            Ok(StatusCode::OK),
        ),
        (
            "POST",
            "/api/v1/configure",
            queue("b.orders"),
            Err("queue_forbidden"),
        ),
        (
            "POST",
            "/api/v1/configure",
            queue("a.new"),
            Ok(StatusCode::OK),
        ),
        (
            "DELETE",
            "/api/v1/resources/queues/b.orders",
            None,
            Err("queue_forbidden"),
        ),
        (
            "DELETE",
            "/api/v1/resources/queues/a.new",
            None,
            Ok(StatusCode::OK),
        ),
        // Routes that span queues are not for limited tokens.
        ("GET", "/api/v1/openapi.json", None, Err("queue_forbidden")),
    ];
    for (method, path, body, want) in cases {
        match want {
            Ok(status) => drop(expect(&env, method, path, Some(&scoped), body, status).await),
            Err(code) => refused(&env, method, path, Some(&scoped), body, code).await,
        }
    }
    // Unlimited tokens pass routes that span queues.
    expect(
        &env,
        "GET",
        "/api/v1/openapi.json",
        Some(&unscoped),
        None,
        StatusCode::OK,
    )
    .await;
    // A scope claim that is neither a string nor strings limits the token to nothing.
    let mut c = claims("odd", "admin");
    c["queues"] = json!(42);
    refused(
        &env,
        "POST",
        "/api/v1/push",
        Some(&hs256(&c)),
        Some(push("a.orders")),
        "queue_forbidden",
    )
    .await;

    // --jwt-protect-metrics: a reader's token is needed.
    assert_unauthorized(&call(&env, "GET", "/metrics", None, None).await, None);
    let a = call(&env, "GET", "/metrics", Some(&unscoped), None).await;
    assert_eq!(a.status, StatusCode::OK);
}

#[tokio::test]
async fn rs256_and_eddsa_public_keys_with_queen_variable_names() {
    let fixtures = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");
    let rsa_private = std::fs::read(format!("{fixtures}/rsa_private.pem")).unwrap();
    let rsa = EncodingKey::from_rsa_pem(&rsa_private).unwrap();
    let ed = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
    let ed_key = EncodingKey::from_ed_pem(ed.serialize_pem().as_bytes()).unwrap();
    let other_ed = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
    let other_key = EncodingKey::from_ed_pem(other_ed.serialize_pem().as_bytes()).unwrap();
    let c = claims("svc", "read-only");
    let path = "/api/v1/openapi.json";

    // RS256 with a public key file, given by flags, next to HS256 (`auto`).
    let env = Env::start_with(&[
        "--jwt-enabled",
        "--jwt-algorithm",
        "auto",
        "--jwt-secret",
        SECRET,
        "--jwt-public-key",
        &format!("{fixtures}/rsa_public.pem"),
    ])
    .await;
    for token in [sign(Header::new(Algorithm::RS256), &c, &rsa), hs256(&c)] {
        expect(&env, "GET", path, Some(&token), None, StatusCode::OK).await;
    }
    // An algorithm without a key here, and an RSA signature announced as HS256 with the
    // public key as its secret (the classic confusion).
    let public_pem = std::fs::read(format!("{fixtures}/rsa_public.pem")).unwrap();
    for token in [
        sign(Header::new(Algorithm::EdDSA), &c, &ed_key),
        sign(
            Header::new(Algorithm::HS256),
            &c,
            &EncodingKey::from_secret(&public_pem),
        ),
    ] {
        assert_unauthorized(
            &call(&env, "GET", path, Some(&token), None).await,
            Some(&token),
        );
    }
    drop(env);

    // EdDSA with the key's PEM text in Queen's variables.
    let pg = comb_harness::Postgres::shared();
    let db = pg.create_database("t").unwrap();
    let public = ed.public_key_pem();
    let server = tokio::task::spawn_blocking(move || {
        comb_harness::Server::start_with_env(
            common::comb_bin(),
            &db,
            &[],
            &[
                ("JWT_ENABLED", "true"),
                ("JWT_ALGORITHM", "EdDSA"),
                ("JWT_PUBLIC_KEY", &public),
                ("JWT_ISSUER", ISSUER),
                ("JWT_CLOCK_SKEW", "0"),
                ("JWT_ROLES_CLAIM", "perm"),
                ("JWT_ROLE_READ_ONLY", "viewer"),
            ],
        )
        .unwrap()
    })
    .await
    .unwrap();
    let http = reqwest::Client::new();
    let get = |token: String| {
        let req = http
            .get(format!("{}{path}", server.base_url()))
            .bearer_auth(token);
        async move { req.send().await.unwrap().status() }
    };
    let mut viewer = claims("svc", "none");
    viewer["perm"] = json!("viewer");
    assert_eq!(
        get(sign(Header::new(Algorithm::EdDSA), &viewer, &ed_key)).await,
        StatusCode::OK
    );
    assert_eq!(get(String::new()).await, StatusCode::UNAUTHORIZED);
    assert_eq!(
        get(sign(Header::new(Algorithm::EdDSA), &viewer, &other_key)).await,
        StatusCode::UNAUTHORIZED
    );
    // No clock skew allowed: expired a few seconds ago is expired.
    let mut expired = viewer.clone();
    expired["exp"] = json!(now() - 5);
    assert_eq!(
        get(sign(Header::new(Algorithm::EdDSA), &expired, &ed_key)).await,
        StatusCode::UNAUTHORIZED
    );
    // The default role claim is not read when another is named.
    assert_eq!(
        get(sign(
            Header::new(Algorithm::EdDSA),
            &claims("svc", "read-only"),
            &ed_key
        ))
        .await,
        StatusCode::FORBIDDEN
    );
}

/// A key set served on 127.0.0.1, which the test changes or turns off.
struct KeySetServer {
    url: String,
    /// The set served; `None` answers 503.
    set: Arc<Mutex<Option<Value>>>,
    fetches: Arc<std::sync::atomic::AtomicUsize>,
}

async fn serve_key_set(initial: Value) -> KeySetServer {
    let set = Arc::new(Mutex::new(Some(initial)));
    let fetches = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (s, f) = (set.clone(), fetches.clone());
    let app = axum::Router::new().route(
        "/jwks.json",
        axum::routing::get(move || {
            let (s, f) = (s.clone(), f.clone());
            async move {
                f.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                match s.lock().unwrap().clone() {
                    Some(v) => (StatusCode::OK, v.to_string()),
                    None => (StatusCode::SERVICE_UNAVAILABLE, String::new()),
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/jwks.json", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    KeySetServer { url, set, fetches }
}

fn ed25519_jwk(kid: &str, key: &rcgen::KeyPair) -> Value {
    json!({"kty": "OKP", "crv": "Ed25519", "kid": kid, "alg": "EdDSA", "use": "sig",
           "x": URL_SAFE_NO_PAD.encode(key.public_key_raw())})
}

/// Polls until `status` of a request with `token` is `want` (the key set is refreshed in
/// the background).
async fn eventually(env: &Env, token: &str, want: StatusCode) {
    common::until(&format!("{want} for the token"), || async {
        call(env, "GET", "/api/v1/openapi.json", Some(token), None)
            .await
            .status
            == want
    })
    .await;
}

#[tokio::test]
async fn a_rotated_key_set_is_followed_and_an_outage_keeps_the_last_one() {
    let old = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
    let new = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
    let keys = serve_key_set(json!({"keys": [ed25519_jwk("old", &old)]})).await;
    let env = Env::start_with(&[
        "--jwt-enabled",
        "--jwt-algorithm",
        "EdDSA",
        "--jwt-jwks-url",
        &keys.url,
        "--jwt-jwks-refresh-seconds",
        "1",
    ])
    .await;
    let token = |kid: &str, key: &rcgen::KeyPair| {
        let mut header = Header::new(Algorithm::EdDSA);
        header.kid = Some(kid.to_string());
        sign(
            header,
            &claims("svc", "read-only"),
            &EncodingKey::from_ed_pem(key.serialize_pem().as_bytes()).unwrap(),
        )
    };
    let (old_token, new_token) = (token("old", &old), token("new", &new));
    // Fetched at start: the first request passes.
    expect(
        &env,
        "GET",
        "/api/v1/openapi.json",
        Some(&old_token),
        None,
        StatusCode::OK,
    )
    .await;
    assert_unauthorized(
        &call(&env, "GET", "/api/v1/openapi.json", Some(&new_token), None).await,
        Some(&new_token),
    );
    // A key id signed with another key than the set's is refused.
    let forged = token("old", &new);
    assert_unauthorized(
        &call(&env, "GET", "/api/v1/openapi.json", Some(&forged), None).await,
        Some(&forged),
    );

    // Rotation: the new key comes in, the old one goes.
    *keys.set.lock().unwrap() = Some(json!({"keys": [ed25519_jwk("new", &new)]}));
    eventually(&env, &new_token, StatusCode::OK).await;
    eventually(&env, &old_token, StatusCode::UNAUTHORIZED).await;

    // Outage: the provider stops answering; the keys fetched before stay in use.
    *keys.set.lock().unwrap() = None;
    let before = keys.fetches.load(std::sync::atomic::Ordering::SeqCst);
    common::until("two fetches during the outage", || async {
        keys.fetches.load(std::sync::atomic::Ordering::SeqCst) >= before + 2
    })
    .await;
    expect(
        &env,
        "GET",
        "/api/v1/openapi.json",
        Some(&new_token),
        None,
        StatusCode::OK,
    )
    .await;
}

#[tokio::test]
async fn a_misconfigured_verifier_stops_the_server_at_start() {
    let pg = comb_harness::Postgres::shared();
    let db = pg.create_database("t").unwrap();
    let started = tokio::task::spawn_blocking(move || {
        comb_harness::Server::start(
            common::comb_bin(),
            &db,
            &["--jwt-enabled", "--jwt-algorithm", "RS256"],
        )
    })
    .await
    .unwrap();
    let e = started.err().expect("refused to start").to_string();
    assert!(e.contains("RS256"), "{e}");
}

#[tokio::test]
async fn a_token_naming_an_unknown_key_id_fetches_the_set_early() {
    let old = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
    let new = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
    let keys = serve_key_set(json!({"keys": [ed25519_jwk("old", &old)]})).await;
    // Queen's name for the URL; the periodic refresh is an hour away.
    let pg = comb_harness::Postgres::shared();
    let db = pg.create_database("t").unwrap();
    let url = keys.url.clone();
    let server = tokio::task::spawn_blocking(move || {
        comb_harness::Server::start_with_env(
            common::comb_bin(),
            &db,
            &["--jwt-enabled", "--jwt-algorithm", "EdDSA"],
            &[("JWT_JWKS_URL", url.as_str())],
        )
        .unwrap()
    })
    .await
    .unwrap();
    let fetched_at_start = keys.fetches.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(fetched_at_start, 1);
    *keys.set.lock().unwrap() = Some(json!({"keys": [
        ed25519_jwk("old", &old), ed25519_jwk("new", &new)]}));
    let mut header = Header::new(Algorithm::EdDSA);
    header.kid = Some("new".into());
    let token = sign(
        header,
        &claims("svc", "read-only"),
        &EncodingKey::from_ed_pem(new.serialize_pem().as_bytes()).unwrap(),
    );
    let http = reqwest::Client::new();
    common::until("the token with the new key id passes", || async {
        http.get(format!("{}/api/v1/openapi.json", server.base_url()))
            .bearer_auth(&token)
            .send()
            .await
            .unwrap()
            .status()
            == StatusCode::OK
    })
    .await;
    // One early fetch, not one per request.
    assert_eq!(keys.fetches.load(std::sync::atomic::Ordering::SeqCst), 2);
}

/// Versions written for the cursors of a partition: a refused ack or extension writes none.
fn cursor_versions(env: &Env, partition: &str) -> String {
    env.sql(&format!(
        "SELECT count(*) FROM comb.cursor_states WHERE partition_id = '{partition}'"
    ))
}

#[tokio::test]
async fn a_token_limited_to_queue_prefixes_may_not_settle_or_extend_another_queues_messages() {
    let env = hs256_server(&["--jwt-queues-claim", "queues"]).await;
    let scoped = |sub: &str, prefix: &str| {
        let mut c = claims(sub, "read-write");
        c["queues"] = json!([prefix]);
        hs256(&c)
    };
    let (a_only, b_only) = (scoped("team-a", "a."), scoped("team-b", "b."));
    let two = json!([{"queue": "b.jobs", "transactionId": "b1", "payload": 1},
                     {"queue": "b.jobs", "transactionId": "b2", "payload": 2}]);
    let popped = push_then_pop(&env, &b_only, two, "/api/v1/pop/queue/b.jobs?batch=2").await;
    let m = &popped["messages"][0];
    let (pid, lease) = (
        m["partitionId"].as_str().unwrap().to_string(),
        m["leaseId"].as_str().unwrap().to_string(),
    );
    let ack = |txid: &str, status: &str| json!({"transactionId": txid, "partitionId": pid, "leaseId": lease, "status": status});
    let before = cursor_versions(&env, &pid);
    // Another team's token knows the ids (they travel in the messages) but may not use them:
    // not to complete, fail or dead-letter, alone, in a batch or in a transaction, nor to
    // keep the lease.
    let attempts = [
        ("/api/v1/ack".to_string(), ack("b1", "completed")),
        ("/api/v1/ack".to_string(), ack("b1", "failed")),
        ("/api/v1/ack".to_string(), ack("b1", "dlq")),
        (
            "/api/v1/ack/batch".to_string(),
            json!({"acknowledgments": [ack("b1", "completed"), ack("b2", "completed")]}),
        ),
        (
            "/api/v1/transaction".to_string(),
            json!({"operations": [{"type": "ack", "transactionId": "b1", "partitionId": pid,
                                   "status": "completed"},
                                  {"type": "push", "items": [{"queue": "a.out", "payload": 1}]}]}),
        ),
        (
            format!("/api/v1/lease/{lease}/extend"),
            json!({"seconds": 3600}),
        ),
        (
            format!("/api/v1/lease/{lease}/extend"),
            json!({"seconds": 3600, "partitionId": pid}),
        ),
    ];
    for (path, body) in attempts {
        refused(
            &env,
            "POST",
            &path,
            Some(&a_only),
            Some(body),
            "queue_forbidden",
        )
        .await;
    }
    assert_eq!(cursor_versions(&env, &pid), before, "nothing was written");
    assert_eq!(
        env.sql("SELECT count(*) FROM comb.queues WHERE name = 'a.out'"),
        "0",
        "the refused transaction pushed nothing"
    );
    // The owner's token settles both, under the lease the pop gave.
    let a = expect(
        &env,
        "POST",
        "/api/v1/ack/batch",
        Some(&b_only),
        Some(json!({"acknowledgments": [ack("b1", "completed"), ack("b2", "completed")]})),
        StatusCode::OK,
    )
    .await;
    assert!(
        a.json()
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["success"] == true),
        "{}",
        a.text
    );
    // Within its own prefix the same token acks and extends as before.
    let own = json!([{"queue": "a.jobs", "payload": 1}]);
    let popped = push_then_pop(&env, &a_only, own, "/api/v1/pop/queue/a.jobs").await;
    let m = &popped["messages"][0];
    expect(
        &env,
        "POST",
        &format!("/api/v1/lease/{}/extend", m["leaseId"].as_str().unwrap()),
        Some(&a_only),
        Some(json!({"seconds": 60})),
        StatusCode::OK,
    )
    .await;
    expect(
        &env,
        "POST",
        "/api/v1/ack",
        Some(&a_only),
        Some(
            json!({"transactionId": m["transactionId"], "partitionId": m["partitionId"],
                    "leaseId": m["leaseId"], "status": "completed"}),
        ),
        StatusCode::OK,
    )
    .await;
}

#[tokio::test]
async fn the_producer_is_shown_in_dead_letters_and_the_message_listings() {
    let env = hs256_server(&[]).await;
    let alice = hs256(&claims("alice", "admin"));
    let items = json!([{"queue": "dl", "transactionId": "t1", "payload": 1},
                       {"queue": "dl", "transactionId": "t2", "payload": 2}]);
    let popped = push_then_pop(&env, &alice, items, "/api/v1/pop/queue/dl?batch=1").await;
    let m = &popped["messages"][0];
    let pid = m["partitionId"].as_str().unwrap().to_string();
    assert_eq!(m["transactionId"], "t1");
    expect(
        &env,
        "POST",
        "/api/v1/ack",
        Some(&alice),
        Some(
            json!({"transactionId": "t1", "partitionId": pid, "leaseId": m["leaseId"],
                    "status": "dlq", "error": "bad"}),
        ),
        StatusCode::OK,
    )
    .await;
    let get = |path: String| {
        let (env, alice) = (&env, &alice);
        async move {
            expect(env, "GET", &path, Some(alice), None, StatusCode::OK)
                .await
                .json()
        }
    };
    let dlq = get("/api/v1/dlq?queue=dl".into()).await;
    assert_eq!(dlq["messages"][0]["producerSub"], "alice", "{dlq}");
    for query in ["", "&status=dead_letter", "&status=pending"] {
        let listed = get(format!("/api/v1/messages?queue=dl{query}")).await;
        let messages = listed["messages"].as_array().unwrap();
        assert!(!messages.is_empty(), "{query}: {listed}");
        assert!(
            messages.iter().all(|m| m["producerSub"] == "alice"),
            "{query}: {listed}"
        );
    }
    let one = get(format!("/api/v1/messages/{pid}/t1")).await;
    assert_eq!(one["producerSub"], "alice", "{one}");
    // A requeued dead letter keeps its producer: an operator does not become it.
    let ops = hs256(&claims("ops", "admin"));
    expect(
        &env,
        "POST",
        &format!("/api/v1/messages/{pid}/t1/retry"),
        Some(&ops),
        None,
        StatusCode::OK,
    )
    .await;
    let again = expect(
        &env,
        "GET",
        "/api/v1/pop/queue/dl?batch=10&autoAck=true",
        Some(&ops),
        None,
        StatusCode::OK,
    )
    .await
    .json();
    let messages = again["messages"].as_array().unwrap();
    assert!(
        messages.iter().any(|m| m["transactionId"] == "t1"),
        "{again}"
    );
    assert!(
        messages.iter().all(|m| m["producerSub"] == "alice"),
        "{again}"
    );
}

#[tokio::test]
async fn queen_skip_paths_open_exactly_the_paths_listed() {
    let env = Env::start_with_env(
        &["--jwt-enabled", "--jwt-secret", SECRET],
        &[(
            "JWT_SKIP_PATHS",
            "/health,/metrics/prometheus,/api/v1/resources/queues, /api/v1/openapi.json",
        )],
    )
    .await;
    for path in [
        "/api/v1/resources/queues",
        "/api/v1/openapi.json",
        "/health",
    ] {
        expect(&env, "GET", path, None, None, StatusCode::OK).await;
    }
    // Only the exact paths: not what lies below them, nor other routes.
    for (method, path) in [
        ("GET", "/api/v1/resources/queues/q"),
        ("GET", "/api/v1/resources/overview"),
        ("GET", "/api/v1/messages"),
    ] {
        assert_unauthorized(&call(&env, method, path, None, None).await, None);
    }
    let a = call(
        &env,
        "POST",
        "/api/v1/push",
        None,
        Some(json!({"items": [{"queue": "q", "payload": 1}]})),
    )
    .await;
    assert_unauthorized(&a, None);
    // The dashboard's pages still ask for a token.
    let page = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
        .get(env.url("/queues"))
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), StatusCode::SEE_OTHER);
    // A skip list that names no path stops the server at start.
    let pg = comb_harness::Postgres::shared();
    let db = pg.create_database("t").unwrap();
    let started = tokio::task::spawn_blocking(move || {
        comb_harness::Server::start(
            common::comb_bin(),
            &db,
            &[
                "--jwt-enabled",
                "--jwt-secret",
                SECRET,
                "--jwt-skip-paths",
                "health",
            ],
        )
    })
    .await
    .unwrap();
    let e = started.err().expect("refused to start").to_string();
    assert!(e.contains("skip path"), "{e}");
}
