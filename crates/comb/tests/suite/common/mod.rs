//! Shared test support: one PostgreSQL per test binary, one database and one `comb serve`
//! process per test, and a small HTTP client speaking the API.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use comb_harness::{Citus, Postgres, Server};
use reqwest::StatusCode;
use serde_json::{Value, json};

/// With this variable set (to anything), every server these tests start requires bearer
/// tokens and every request of [`client`] carries an administrator's, so that any suite can
/// show that tokens of the right role pass all of it:
/// `COMB_TESTS_WITH_TOKENS=1 cargo test -p comb --test suite routes::`.
pub const WITH_TOKENS: &str = "COMB_TESTS_WITH_TOKENS";

/// The HS256 secret of servers started under [`WITH_TOKENS`].
pub const TOKENS_SECRET: &str = "comb-tests-secret-of-more-than-32-bytes";

/// `args` with the flags requiring tokens first, under [`WITH_TOKENS`].
fn with_token_flags(args: &[&str]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    if std::env::var_os(WITH_TOKENS).is_some() {
        out.extend(["--jwt-enabled", "--jwt-secret", TOKENS_SECRET].map(String::from));
    }
    out.extend(args.iter().map(|s| s.to_string()));
    out
}

/// The variable naming the backend every [`Env`] runs on: unset or `postgres`, the shared
/// PostgreSQL cluster; `citus`, a database of the shared Citus cluster (a coordinator and two
/// workers). `make test` runs the data-path modules once on each (`scripts/test-citus.sh`).
pub const BACKEND: &str = "COMB_TEST_BACKEND";

/// Whether this run's servers are on Citus ([`BACKEND`]). Panics on a value it does not know,
/// so that a misspelt backend cannot run the suite on the wrong one.
pub fn on_citus() -> bool {
    match std::env::var(BACKEND).as_deref() {
        Err(_) | Ok("") | Ok("postgres") => false,
        Ok("citus") => true,
        Ok(other) => panic!("{BACKEND}={other}: expected postgres or citus"),
    }
}

/// The node tests' databases live on and are queried through: the shared PostgreSQL, or the
/// shared Citus cluster's coordinator.
pub fn database_node() -> &'static Postgres {
    if on_citus() {
        Citus::shared().coordinator()
    } else {
        Postgres::shared()
    }
}

/// A fresh database on this run's backend (on Citus, with the extension on every node and
/// the workers added); its URL. Blocking.
pub fn create_database(prefix: &str) -> String {
    if on_citus() {
        Citus::shared().create_database_from(citus_template(), prefix)
    } else {
        Postgres::shared().create_database(prefix)
    }
    .expect("create database")
}

/// A database of the shared Citus cluster that `comb migrate` distributed, frozen as the
/// template of every test's database: migrating and distributing takes seconds per database
/// on Citus, a copy a fraction of that. Made on first use. Blocking.
fn citus_template() -> &'static str {
    static TEMPLATE: OnceLock<String> = OnceLock::new();
    TEMPLATE.get_or_init(|| {
        let citus = Citus::shared();
        make_inspector(citus);
        let url = citus.create_database("template").expect("create database");
        let out = std::process::Command::new(comb_bin())
            .arg("migrate")
            .env("DATABASE_URL", &url)
            .output()
            .expect("comb migrate runs");
        assert!(
            out.status.success(),
            "comb migrate on Citus failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let name = url.rsplit('/').next().unwrap().to_string();
        citus.freeze_template(&name).expect("template frozen");
        name
    })
}

/// The role tests read a Citus database as ([`Env::sql`]): a superuser allowed nested
/// distributed execution on every node.
pub const INSPECTOR: &str = "comb_inspector";

/// Makes [`INSPECTOR`] on every node of `citus` (roles are per node, not per database).
fn make_inspector(citus: &Citus) {
    let sql = format!(
        "DO $$ BEGIN
           IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{INSPECTOR}') THEN
             CREATE ROLE {INSPECTOR} SUPERUSER LOGIN;
           END IF;
         END $$;
         ALTER ROLE {INSPECTOR} SET citus.allow_nested_distributed_execution TO on;"
    );
    for node in std::iter::once(citus.coordinator()).chain(citus.workers()) {
        node.psql("postgres", &sql)
            .expect("the inspecting role is made");
    }
}

/// Drops a database [`create_database`] made (on every node of a Citus cluster). Blocking.
pub fn drop_database(name: &str) {
    let drop = format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)");
    if on_citus() {
        let citus = Citus::shared();
        for node in std::iter::once(citus.coordinator()).chain(citus.workers()) {
            let _ = node.psql("postgres", &drop);
        }
    } else {
        let _ = Postgres::shared().psql("postgres", &drop);
    }
}

/// A server on its own fresh database.
pub struct Env {
    pub server: Server,
    pub db_url: String,
    pub db_name: String,
    pub http: reqwest::Client,
}

/// Path of the `comb` binary (package `comb-cli`), built once per test run in this build's
/// profile: Cargo builds only a package's own binaries for its tests, and `comb` is another
/// package's. `COMB_BIN` names a binary to use instead.
pub fn comb_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Some(bin) = std::env::var_os("COMB_BIN") {
            return bin.into();
        }
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let release = !cfg!(debug_assertions);
        let mut build = std::process::Command::new(env!("CARGO"));
        build
            .current_dir(&root)
            .args(["build", "--quiet", "-p", "comb-cli", "--bin", "comb"]);
        if release {
            build.arg("--release");
        }
        let status = build.status().expect("cargo runs");
        assert!(status.success(), "cargo build -p comb-cli failed");
        let target = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| root.join("target"));
        target
            .join(if release { "release" } else { "debug" })
            .join("comb")
    })
}

impl Env {
    /// A fresh database and a server on it.
    pub async fn start() -> Env {
        Env::start_with(&[]).await
    }

    /// Same, with extra `comb serve` flags.
    pub async fn start_with(args: &[&str]) -> Env {
        Env::start_with_env(args, &[]).await
    }

    /// Same, with extra `comb serve` flags and environment variables (for configuration read
    /// only from the environment, such as encryption keys).
    pub async fn start_with_env(args: &[&str], vars: &[(&str, &str)]) -> Env {
        let args = with_token_flags(args);
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Env::serve(None, args, vars).await
    }

    /// A server on a database the test made itself (`db_url`, on the shared PostgreSQL).
    pub async fn start_on(db_url: String) -> Env {
        Env::serve(Some(db_url), with_token_flags(&[]), Vec::new()).await
    }

    /// A server with `args` and `vars` on `db_url`, or on a fresh database.
    async fn serve(db_url: Option<String>, args: Vec<String>, vars: Vec<(String, String)>) -> Env {
        tokio::task::spawn_blocking(move || {
            let db_url = db_url.unwrap_or_else(|| create_database("t"));
            let db_name = db_url.rsplit('/').next().unwrap().to_string();
            let argv: Vec<&str> = args.iter().map(String::as_str).collect();
            let env: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (&**k, &**v)).collect();
            let server =
                Server::start_with_env(comb_bin(), &db_url, &argv, &env).expect("server starts");
            Env {
                server,
                db_url,
                db_name,
                http: client(),
            }
        })
        .await
        .unwrap()
    }

    /// Another server on the same database.
    pub async fn second_server(&self) -> Server {
        self.second_server_with(&[]).await
    }

    /// Another server on the same database, with extra environment variables.
    pub async fn second_server_with_env(&self, vars: &[(&str, &str)]) -> Server {
        let url = self.db_url.clone();
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        tokio::task::spawn_blocking(move || {
            let env: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (&**k, &**v)).collect();
            Server::start_with_env(comb_bin(), &url, &[], &env).unwrap()
        })
        .await
        .unwrap()
    }

    /// Another server on the same database, with extra `comb serve` flags.
    pub async fn second_server_with(&self, args: &[&str]) -> Server {
        let url = self.db_url.clone();
        let args = with_token_flags(args);
        tokio::task::spawn_blocking(move || {
            let argv: Vec<&str> = args.iter().map(String::as_str).collect();
            Server::start(comb_bin(), &url, &argv).unwrap()
        })
        .await
        .unwrap()
    }

    /// Configures a queue's options and asserts 200; returns the answer.
    pub async fn configure(&self, queue: &str, options: Value) -> Value {
        let (s, body) = self
            .post(
                "/api/v1/configure",
                &json!({"queue": queue, "options": options}),
            )
            .await;
        assert_eq!(s, StatusCode::OK, "configure {queue}: {body}");
        body
    }

    /// Pops until the answer is 204 and returns every message handed out, in order. Meant
    /// for auto-ack pops; a leased pop would stop at the first leased partition.
    pub async fn drain(&self, path_and_query: &str) -> Vec<Value> {
        let mut out = Vec::new();
        while let Some(pop) = self.pop(path_and_query).await {
            let messages = pop["messages"].as_array().unwrap();
            assert!(!messages.is_empty(), "200 without messages: {pop}");
            out.extend(messages.iter().cloned());
        }
        out
    }

    /// Acks one message (as found in a pop answer) through `POST /api/v1/ack`.
    pub async fn ack(
        &self,
        message: &Value,
        status: &str,
        group: Option<&str>,
        error: Option<&str>,
    ) -> (StatusCode, Value) {
        self.post(
            "/api/v1/ack",
            &json!({
                "transactionId": message["transactionId"],
                "partitionId": message["partitionId"],
                "leaseId": message["leaseId"],
                "status": status,
                "consumerGroup": group,
                "error": error,
            }),
        )
        .await
    }

    /// Acks one message, asserts that the ack succeeded, and returns its result.
    pub async fn ack_ok(
        &self,
        message: &Value,
        status: &str,
        group: Option<&str>,
        error: Option<&str>,
    ) -> Value {
        let (s, body) = self.ack(message, status, group, error).await;
        assert_eq!(s, StatusCode::OK, "ack {status}: {body}");
        assert_eq!(body[0]["success"], true, "ack {status}: {body}");
        body[0].clone()
    }

    /// Like [`Env::post`], also returning the answer's headers.
    pub async fn post_full(
        &self,
        path: &str,
        body: &Value,
    ) -> (StatusCode, reqwest::header::HeaderMap, Value) {
        let r = self
            .http
            .post(self.url(path))
            .json(body)
            .send()
            .await
            .expect("request");
        let headers = r.headers().clone();
        let (status, body) = read(r).await;
        (status, headers, body)
    }

    /// Number of message rows stored.
    pub fn message_count(&self) -> i64 {
        self.sql("SELECT count(*) FROM comb.messages")
            .parse()
            .unwrap()
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.server.base_url(), path)
    }

    /// Runs SQL on this test's database and returns psql's unaligned output.
    ///
    /// On Citus it runs as [`INSPECTOR`]: the tests' reads of the cursors' latest states
    /// (`comb.cursors_now`, which calls a PL/pgSQL function per cursor) nest a router query
    /// of a shard in a query of all of them, which Citus allows only to a role told so on
    /// every node. The servers connect as `postgres`, so their own statements never are.
    pub fn sql(&self, sql: &str) -> String {
        let user = if on_citus() { INSPECTOR } else { "postgres" };
        database_node()
            .psql_as(user, &self.db_name, sql)
            .expect("psql")
            .trim()
            .to_string()
    }

    /// The column options of `partition_id` on every child table of `parent`, distinct and
    /// comma-separated (`none` for a table without any).
    pub fn partition_id_options(&self, parent: &str) -> String {
        self.sql(&format!(
            "SELECT string_agg(DISTINCT coalesce('{{' || (SELECT string_agg(o.option_name || '=' || o.option_value, ',') FROM pg_options_to_table(a.attoptions) o WHERE o.option_name <> 'pg_attver') || '}}', 'none'), ',') \
             FROM pg_inherits h JOIN pg_attribute a \
               ON a.attrelid = h.inhrelid AND a.attname = 'partition_id' \
             WHERE h.inhparent = '{parent}'::regclass"
        ))
    }

    pub async fn post(&self, path: &str, body: &Value) -> (StatusCode, Value) {
        let r = self
            .http
            .post(self.url(path))
            .json(body)
            .send()
            .await
            .expect("request");
        read(r).await
    }

    /// Deletes a queue through the API; the status it answered.
    pub async fn delete_queue(&self, queue: &str) -> StatusCode {
        self.http
            .delete(self.url(&format!("/api/v1/resources/queues/{queue}")))
            .send()
            .await
            .expect("request")
            .status()
    }

    pub async fn post_raw(&self, path: &str, body: Vec<u8>) -> (StatusCode, Value) {
        let r = self
            .http
            .post(self.url(path))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .expect("request");
        read(r).await
    }

    pub async fn delete(&self, path: &str) -> (StatusCode, Value) {
        let r = self
            .http
            .delete(self.url(path))
            .send()
            .await
            .expect("request");
        read(r).await
    }

    /// The server's `/metrics` text.
    pub async fn metrics_text(&self) -> String {
        let r = self.http.get(self.url("/metrics")).send().await.unwrap();
        r.text().await.unwrap()
    }

    pub async fn get(&self, path: &str) -> (StatusCode, Value) {
        let r = self.http.get(self.url(path)).send().await.expect("request");
        read(r).await
    }

    /// Pushes items and asserts 201.
    pub async fn push(&self, items: Value) -> Vec<Value> {
        let (status, body) = self.post("/api/v1/push", &json!({ "items": items })).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        body.as_array().expect("array").clone()
    }

    /// Pops (GET form) and returns the body, or None on 204.
    pub async fn pop(&self, path_and_query: &str) -> Option<Value> {
        let (status, body) = self.get(path_and_query).await;
        match status {
            StatusCode::OK => Some(body),
            StatusCode::NO_CONTENT => None,
            other => panic!("pop {path_and_query}: {other} {body}"),
        }
    }

    /// Pops `queue` at once and, when nothing is there, waits for a message (30 s at most).
    /// For messages held back for a while (a delay, a retry): a test expects nothing at
    /// once, but a machine too slow to look within the hold finds the message already there,
    /// so the test checks when it came rather than that the first look was empty.
    pub async fn pop_now_or_wait(&self, queue: &str) -> Value {
        let path = format!("/api/v1/pop/queue/{queue}");
        match self.pop(&path).await {
            Some(pop) => pop,
            None => self
                .pop(&format!("{path}?wait=true&timeout=30000"))
                .await
                .unwrap_or_else(|| panic!("nothing came out of {queue} within 30 s")),
        }
    }

    /// Acks messages from a pop response with one status, through the batch route.
    pub async fn ack_all(&self, pop: &Value, status: &str, group: Option<&str>) -> Vec<Value> {
        let acks: Vec<Value> = pop["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                json!({
                    "transactionId": m["transactionId"],
                    "partitionId": m["partitionId"],
                    "leaseId": m["leaseId"],
                    "status": status,
                    "consumerGroup": group,
                })
            })
            .collect();
        let (s, body) = self
            .post("/api/v1/ack/batch", &json!({ "acknowledgments": acks }))
            .await;
        assert_eq!(s, StatusCode::OK, "{body}");
        body.as_array().unwrap().clone()
    }
}

impl Drop for Env {
    /// Stops the server and drops the test's database: the suite's tests share one cluster
    /// for the whole run, whose disk would otherwise hold every test's data until the end.
    fn drop(&mut self) {
        self.server.kill();
        drop_database(&self.db_name);
    }
}

/// Sends a request head (and no body) over a raw socket and reads the answer: the status and
/// the body. For answers given from the head alone, such as a too-large `Content-Length`.
pub fn raw_head_only(addr: std::net::SocketAddr, head: &str) -> (u16, Value) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(PATIENCE)).unwrap();
    s.write_all(head.as_bytes()).unwrap();
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf).to_string();
    let status: u16 = text.split(' ').nth(1).unwrap().parse().unwrap();
    let body = text.split("\r\n\r\n").nth(1).unwrap_or("");
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

/// `GET` of a full URL (any server) with the same answer checks as [`Env::get`].
pub async fn get_url(http: &reqwest::Client, url: &str) -> (StatusCode, Value) {
    let r = http.get(url).send().await.expect("request");
    read(r).await
}

/// An HTTP client with its own connection pool.
pub fn client() -> reqwest::Client {
    let mut headers = reqwest::header::HeaderMap::new();
    if std::env::var_os(WITH_TOKENS).is_some() {
        let claims = serde_json::json!({"sub": "tests", "role": "admin", "exp": 4_102_444_800u64});
        let token = jsonwebtoken::encode(
            &jsonwebtoken::Header::default(),
            &claims,
            &jsonwebtoken::EncodingKey::from_secret(TOKENS_SECRET.as_bytes()),
        )
        .unwrap();
        headers.insert(
            reqwest::header::AUTHORIZATION,
            format!("Bearer {token}").parse().unwrap(),
        );
    }
    reqwest::Client::builder()
        .timeout(Duration::from_secs(120))
        .default_headers(headers)
        .build()
        .unwrap()
}

async fn read(r: reqwest::Response) -> (StatusCode, Value) {
    let status = r.status();
    let is_problem = r.headers().get("content-type").is_some_and(|v| {
        v.to_str()
            .unwrap_or("")
            .starts_with("application/problem+json")
    });
    let bytes = r.bytes().await.expect("body");
    let body = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into()))
    };
    if status.is_client_error() || status.is_server_error() {
        assert!(is_problem, "error without problem+json: {status} {body}");
        assert_eq!(body["status"], status.as_u16(), "{body}");
        assert_eq!(body["error"], body["detail"], "{body}");
    }
    (status, body)
}

/// The only message of a pop response (asserts there is exactly one).
pub fn one(pop: &Value) -> &Value {
    let messages = pop["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 1, "{pop}");
    &messages[0]
}

/// How long a test waits for what the server does in its own time (a background task, a
/// wake-up, a process starting) before failing. A loaded CI machine runs everything many
/// times slower for seconds at a time; the waits below return as soon as their condition
/// holds, so this much is only ever spent when the awaited thing never happens.
pub const PATIENCE: Duration = Duration::from_secs(120);

/// Waits until `check` holds, looking every 200 ms; fails the test after `limit`.
pub async fn eventually(limit: Duration, what: &str, mut check: impl FnMut() -> bool) {
    let start = std::time::Instant::now();
    while !check() {
        assert!(start.elapsed() < limit, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits until the asynchronous `check` holds, looking every 100 ms; fails the test after
/// [`PATIENCE`].
pub async fn until<F: std::future::Future<Output = bool>>(
    what: &str,
    mut check: impl FnMut() -> F,
) {
    let start = std::time::Instant::now();
    while !check().await {
        assert!(start.elapsed() < PATIENCE, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A pop that waits, started in the background on its own client. It is asked again while
/// the server answers 429 (all waiting places taken, for a moment by a probe of
/// [`until_waiting_places_are_taken`]); resolves to the answer and how long its last ask took.
pub fn waiting_pop(url: String) -> tokio::task::JoinHandle<(StatusCode, Value, Duration)> {
    tokio::spawn(async move {
        let http = client();
        loop {
            let started = std::time::Instant::now();
            let (s, b) = get_url(&http, &url).await;
            if s != StatusCode::TOO_MANY_REQUESTS {
                return (s, b, started.elapsed());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
}

/// Waits until every waiting place of the server at `base` (started with
/// `--max-waiting-pops`) is taken, which is how a test knows its background pops are
/// waiting: a probe that would wait 1 ms on `queue` is refused with 429. Returns that refusal.
pub async fn until_waiting_places_are_taken(
    http: &reqwest::Client,
    base: &str,
    queue: &str,
) -> reqwest::Response {
    let url = format!("{base}/api/v1/pop/queue/{queue}?wait=true&timeout=1");
    let start = std::time::Instant::now();
    loop {
        let r = http.get(&url).send().await.expect("request");
        if r.status() == StatusCode::TOO_MANY_REQUESTS {
            return r;
        }
        assert_eq!(r.status(), StatusCode::NO_CONTENT, "the probe of {queue}");
        assert!(
            start.elapsed() < PATIENCE,
            "the waiting places were never all taken"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The next number of a xorshift sequence: cheap, seeded, repeatable load shapes.
pub fn xorshift(seed: &mut u64) -> u64 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    *seed
}

/// Payload numbers of a pop response's messages, in order (`data.n`).
pub fn numbers(pop: &Value) -> Vec<i64> {
    pop["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["data"]["n"].as_i64().unwrap())
        .collect()
}

/// Checks an `EXPLAIN ANALYZE` plan of a read that wants a few rows in index order: nothing
/// was sorted, and no scan returned more than `rows` rows.
pub fn assert_ordered_read(what: &str, plan: &str, rows: u32) {
    assert!(!plan.contains("Sort Method"), "{what} sorted:\n{plan}");
    assert_scans_return_at_most(what, plan, rows);
}

/// Checks that no scan of an `EXPLAIN ANALYZE` plan returned more than `rows` rows.
pub fn assert_scans_return_at_most(what: &str, plan: &str, rows: u32) {
    let scans = plan
        .lines()
        .filter(|l| l.contains("Scan") && !l.contains("(never executed)"));
    for line in scans {
        let read: u32 = line
            .split("actual rows=")
            .nth(1)
            .and_then(|r| r.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{what}: no row count in {line}"));
        assert!(read <= rows, "{what} read {read} rows:\n{plan}");
    }
}

/// The `/metrics` text of the server at `base`.
pub async fn metrics_at(http: &reqwest::Client, base: &str) -> String {
    http.get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// A counter or gauge of the `/metrics` of the server at `base` (0 when absent).
pub async fn metric_at(http: &reqwest::Client, base: &str, name: &str) -> u64 {
    metrics_at(http, base)
        .await
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .map_or(0, |v| v.trim().parse::<f64>().unwrap() as u64)
}
