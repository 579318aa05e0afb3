//! The dashboard in a real browser: headless Chromium (Debian's `chromium` and
//! `chromium-driver`, installed by `make test`) driven over WebDriver against a real
//! `comb serve` on a real PostgreSQL. Screenshots go to `target/screenshots/`.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{self, Env};
use fantoccini::{Client, ClientBuilder, Locator};
use reqwest::StatusCode;
use serde_json::{Value, json};

/// A headless Chromium behind its own chromedriver, closed when dropped.
struct Browser {
    client: Client,
    driver: Child,
}

impl Browser {
    /// Starts chromedriver on a free port and opens a session sized like a laptop screen.
    async fn start() -> Browser {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let driver = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver runs (scripts/install-chromium.sh installs it)");
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".into(),
            json!({
                "binary": "/usr/bin/chromium",
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                         "--disable-dev-shm-usage", "--window-size=1280,900",
                         "--hide-scrollbars", "--force-color-profile=srgb"],
            }),
        );
        let url = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + common::PATIENCE;
        let client = loop {
            let connector = hyper_util::client::legacy::connect::HttpConnector::new();
            match ClientBuilder::new(connector)
                .capabilities(caps.clone())
                .connect(&url)
                .await
            {
                Ok(c) => break c,
                Err(e) if Instant::now() < deadline => {
                    let _ = e;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => panic!("no WebDriver session: {e}"),
            }
        };
        Browser { client, driver }
    }

    async fn open(&self, url: &str) {
        self.client.goto(url).await.expect("page opens");
    }

    /// The first element matching `css`, waiting for one (a loaded machine can take long).
    async fn find(&self, css: &str) -> fantoccini::elements::Element {
        self.client
            .wait()
            .at_most(Duration::from_secs(60))
            .for_element(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("no {css}: {e}"))
    }

    /// The text of the first element matching `css`.
    async fn text(&self, css: &str) -> String {
        self.find(css).await.text().await.unwrap()
    }

    /// Waits for the text of `css` to satisfy `ok`; returns the last text seen.
    async fn wait_text(&self, css: &str, ok: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let text = match self.client.find(Locator::Css(css)).await {
                Ok(e) => e.text().await.unwrap_or_default(),
                Err(_) => String::new(),
            };
            if ok(&text) {
                return text;
            }
            if Instant::now() > deadline {
                panic!("{css} never matched; last text: {text:?}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn click(&self, css: &str) {
        self.find(css)
            .await
            .click()
            .await
            .unwrap_or_else(|e| panic!("click {css}: {e}"));
    }

    /// Runs a script and returns its value.
    async fn eval(&self, script: &str) -> Value {
        self.client.execute(script, vec![]).await.expect("script")
    }

    /// Saves a screenshot as `target/screenshots/NAME.png`.
    async fn screenshot(&self, name: &str) {
        let png = self.client.screenshot().await.expect("screenshot");
        let dir = screenshots();
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(format!("{name}.png")), png).unwrap();
    }

    async fn close(mut self) {
        let _ = self.client.clone().close().await;
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.driver.kill();
    }
}

fn screenshots() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/screenshots")
}

#[tokio::test]
async fn the_overview_and_the_queues_show_a_queue_with_its_depth() {
    // Per-minute counters written every 200 ms, so the hour's throughput shows at once.
    let env = Env::start_with(&["--stats-interval-ms", "200"]).await;
    let items: Vec<Value> = (0..7)
        .map(
            |i| json!({"queue": "orders", "partition": format!("c{}", i % 3), "payload": {"n": i}}),
        )
        .chain((0..2).map(|i| json!({"queue": "emails", "payload": {"to": i}})))
        .collect();
    env.push(json!(items)).await;

    let browser = Browser::start().await;
    browser.open(&env.url("/")).await;
    assert_eq!(browser.text("#total-depth").await, "9");
    let deepest = browser.text("#deepest tbody tr:first-child").await;
    assert!(
        deepest.starts_with("orders") && deepest.contains('7'),
        "{deepest}"
    );
    assert_eq!(browser.text("#queue-count").await, "2");
    // The footer names the build that answered and the schema it knows, as `/health` does.
    let (_, health) = env.get("/health").await;
    assert_eq!(browser.text("#version").await, env!("CARGO_PKG_VERSION"));
    assert_eq!(
        browser.text("#schema-version").await,
        health["schemaVersion"].to_string()
    );
    // The registry: the server registered as it started, before any counters were written.
    assert_eq!(browser.text("#servers").await, "1");
    // The server's own counters: the hour saw nine pushes.
    browser
        .wait_text("#hour-totals", |t| t.starts_with("9 pushed"))
        .await;
    let bars = browser
        .eval("return document.querySelectorAll('svg.chart rect.s-in').length")
        .await;
    assert!(bars.as_u64().unwrap() >= 1, "a bar for the pushes: {bars}");
    browser.screenshot("overview").await;

    // The queues table, sorted by depth and then by name.
    browser.open(&env.url("/queues")).await;
    assert_eq!(
        browser.text("#queues tr[data-queue=orders] td.depth").await,
        "7"
    );
    let first = browser.text("#queues tbody tr:first-child th").await;
    assert_eq!(first, "orders", "deepest first");
    browser.click("#queues thead th:first-child a").await;
    browser
        .wait_text("#queues tbody tr:first-child th", |t| t == "emails")
        .await;
    browser.screenshot("queues").await;

    // The queue: its three partitions with their depths.
    browser.open(&env.url("/queues/orders")).await;
    assert_eq!(browser.text("#partition-count").await, "3");
    let rows = browser
        .eval("return [...document.querySelectorAll('#partitions tbody tr')].map(r => r.children[0].textContent + '=' + r.children[1].textContent).sort().join(',')")
        .await;
    assert_eq!(rows, json!("c0=3,c1=2,c2=2"));
    browser.screenshot("queue").await;
    browser.close().await;
}

#[tokio::test]
async fn a_dead_letter_is_requeued_from_the_page_and_a_consumer_receives_it() {
    let env = Env::start().await;
    env.configure("jobs", json!({"retryLimit": 1})).await;
    env.push(json!([{"queue": "jobs", "partition": "p1", "payload": {"job": "resize", "id": 42}, "transactionId": "job-42"}]))
        .await;
    let pop = env
        .pop("/api/v1/pop/queue/jobs?batch=1")
        .await
        .expect("a message");
    let message = &pop["messages"][0];
    let (status, body) = env
        .ack(message, "dlq", None, Some("image too large: 9000x9000"))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(
        env.pop("/api/v1/pop/queue/jobs?batch=1").await.is_none(),
        "dead-lettered"
    );

    let browser = Browser::start().await;
    browser.open(&env.url("/dead-letters?queue=jobs")).await;
    assert_eq!(browser.text("#dlq-total").await, "1");
    let entry = browser.text("#dead-letters .entry summary").await;
    assert!(entry.contains("image too large: 9000x9000"), "{entry}");
    browser.click("#dead-letters .entry summary").await;
    let payload = browser.text("#dead-letters .entry pre.payload").await;
    assert!(payload.contains("\"resize\""), "{payload}");

    // Requeue: the button asks first; nothing moves until the confirmation.
    browser.click("#dead-letters .entry button.requeue").await;
    let question = browser.text(".confirm p").await;
    assert!(
        question.starts_with("Requeue dead letter job-42"),
        "{question}"
    );
    browser.screenshot("dead-letters-confirm").await;
    assert!(
        env.pop("/api/v1/pop/queue/jobs?batch=1").await.is_none(),
        "not before confirming"
    );
    browser.click("#confirm-yes").await;
    let notice = browser.text(".notice").await;
    assert!(notice.starts_with("Requeued 1 dead letter"), "{notice}");
    browser.screenshot("dead-letters-requeued").await;

    // A consumer receives it again, with its payload.
    let pop = env
        .pop("/api/v1/pop/queue/jobs?batch=1&wait=true&timeout=30000")
        .await
        .expect("requeued message delivered");
    assert_eq!(
        pop["messages"][0]["data"],
        json!({"job": "resize", "id": 42})
    );
    assert_eq!(pop["messages"][0]["transactionId"], "job-42");
    browser.close().await;
}

#[tokio::test]
async fn actions_without_the_pages_token_are_refused() {
    let env = Env::start().await;
    let client = reqwest::Client::new();
    // No cookie, no header: a cross-site form post looks like this.
    let r = client
        .post(env.url("/dead-letters/purge"))
        .form(&[("queue", "q")])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    // The cookie alone (a browser sends it with any request to this host) is not enough.
    let page = client.get(env.url("/")).send().await.unwrap();
    let cookie = page
        .headers()
        .get("set-cookie")
        .expect("the page sets the token")
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_string();
    let token = cookie.split_once('=').unwrap().1.to_string();
    let body = page.text().await.unwrap();
    assert!(body.contains(&token), "the page carries the token for htmx");
    let r = client
        .post(env.url("/groups/g/seek"))
        .header("cookie", &cookie)
        .form(&[("queue", "q"), ("to", "end")])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    // Both, from another origin: refused too.
    let r = client
        .post(env.url("/groups/g/seek"))
        .header("cookie", &cookie)
        .header("x-comb-csrf", &token)
        .header("origin", "https://elsewhere.example")
        .form(&[("queue", "q"), ("to", "end")])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    // And the dashboard's routes are not part of the JSON API's description.
    let (_, openapi) = env.get("/api/v1/openapi.json").await;
    assert!(openapi["paths"].get("/queues").is_none());
}

#[tokio::test]
async fn assets_are_served_from_the_binary() {
    let env = Env::start().await;
    for (path, kind, needle) in [
        ("/assets/htmx.min.js", "text/javascript", "htmx"),
        ("/assets/comb.css", "text/css", "prefers-color-scheme"),
    ] {
        let r = reqwest::get(env.url(path)).await.unwrap();
        assert_eq!(r.status(), StatusCode::OK, "{path}");
        let ct = r.headers()["content-type"].to_str().unwrap().to_string();
        assert!(ct.starts_with(kind), "{path}: {ct}");
        assert!(r.text().await.unwrap().contains(needle), "{path}");
    }
    let r = reqwest::get(env.url("/assets/nothing.js")).await.unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn the_tail_shows_new_messages_without_consuming_them_and_opens_a_message() {
    let env = Env::start().await;
    let pushed = env
        .push(json!([{"queue": "events", "partition": "a", "payload": {"kind": "signup"}, "transactionId": "ev-1"}]))
        .await;
    let (status, body) = env
        .post(
            "/api/v1/traces",
            &json!({"transactionId": "ev-1", "partitionId": pushed[0]["partition_id"],
                    "consumerGroup": "mailer", "eventType": "info",
                    "traceNames": ["welcome-mail"], "data": {"step": "rendered"}}),
        )
        .await;
    assert!(status.is_success(), "{status} {body}");
    let browser = Browser::start().await;
    browser.open(&env.url("/queues/events/tail")).await;
    let first = browser.text("#tail tbody tr:first-child").await;
    assert!(
        first.contains("ev-1") && first.contains("signup"),
        "{first}"
    );
    // A message pushed now appears on its own (the page refreshes itself), newest first.
    env.push(json!([{"queue": "events", "partition": "b", "payload": {"kind": "login"}, "transactionId": "ev-2"}]))
        .await;
    browser
        .wait_text("#tail tbody tr:first-child", |t| t.contains("ev-2"))
        .await;
    browser.screenshot("tail").await;

    // The tail consumed nothing: a consumer still receives both.
    let got = env
        .drain("/api/v1/pop/queue/events?batch=10&autoAck=true")
        .await;
    let mut ids: Vec<&str> = got
        .iter()
        .map(|m| m["transactionId"].as_str().unwrap())
        .collect();
    ids.sort();
    assert_eq!(ids, ["ev-1", "ev-2"]);

    // A message's page: its payload and where each group is with it.
    browser.open(&env.url("/queues/events/tail")).await;
    browser.click("#tail a[href*='ev-1']").await;
    let payload = browser.text("#payload").await;
    assert!(payload.contains("\"signup\""), "{payload}");
    let groups = browser.text("#message-groups tbody").await;
    assert!(
        groups.contains("__QUEUE_MODE__") && groups.contains("completed"),
        "{groups}"
    );
    browser.screenshot("message").await;
    browser.close().await;
}

#[tokio::test]
async fn consumer_groups_show_their_lag_and_seek_to_the_end_from_the_page() {
    let env = Env::start().await;
    let items: Vec<Value> = (0..5)
        .map(|i| json!({"queue": "feed", "partition": format!("p{}", i % 2), "payload": {"i": i}}))
        .collect();
    env.push(json!(items)).await;
    // The group subscribes (from the start) and takes one message, acked.
    let pop = env
        .pop("/api/v1/pop/queue/feed?consumerGroup=analytics&batch=1&subscriptionMode=all&autoAck=true")
        .await
        .expect("a message");
    assert_eq!(pop["messages"].as_array().unwrap().len(), 1);

    let browser = Browser::start().await;
    browser.open(&env.url("/groups")).await;
    let row = browser.text("#groups tbody tr").await;
    assert!(
        row.starts_with("analytics") && row.contains("feed"),
        "{row}"
    );
    assert_eq!(browser.text("#groups tbody tr td:nth-child(3)").await, "4");

    // The queue's page shows the group's lag per partition.
    browser.open(&env.url("/queues/feed")).await;
    let lags = browser
        .eval("return [...document.querySelectorAll('#partitions tbody tr')].map(r => r.children[0].textContent + '=' + r.children[4].textContent).join(',')")
        .await;
    let lags = lags.as_str().unwrap().to_string();
    assert!(lags == "p0=2,p1=2" || lags == "p0=3,p1=1", "{lags}");
    browser.screenshot("queue-with-group").await;

    // Seek to the end: the browser asks first (a native confirm), then the lag is gone.
    browser.open(&env.url("/groups")).await;
    browser.click("#groups form.seek button").await;
    browser.client.accept_alert().await.expect("a confirmation");
    let notice = browser.text(".notice").await;
    assert!(notice.contains("moved"), "{notice}");
    browser
        .wait_text("#groups tbody tr td:nth-child(3)", |t| t == "0")
        .await;
    browser.screenshot("groups").await;
    assert!(
        env.pop("/api/v1/pop/queue/feed?consumerGroup=analytics&batch=10")
            .await
            .is_none(),
        "nothing left for the group after the seek"
    );
    browser.close().await;
}

#[tokio::test]
async fn a_queue_of_ten_thousand_partitions_pages_its_partitions() {
    let env = Env::start().await;
    for chunk in 0..10 {
        let items: Vec<Value> = (0..1000)
            .map(|i| {
                let n = chunk * 1000 + i;
                json!({"queue": "wide", "partition": format!("p{n:05}"), "payload": {"n": n}})
            })
            .collect();
        env.push(json!(items)).await;
    }
    // Server time of the page, measured by the server itself (Server-Timing), reported but
    // not asserted: timing belongs to benchmarks (scripts/dashboard-wide-queue.sh).
    let r = reqwest::get(env.url("/queues/wide")).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let timing = r.headers()["server-timing"].to_str().unwrap().to_string();
    eprintln!("GET /queues/wide with 10,000 partitions: Server-Timing {timing}");

    // Every page shows its 500 partitions, each with its own figures, and the queue's totals.
    let browser = Browser::start().await;
    let rows = "const rows = [...document.querySelectorAll('#partitions tbody tr')];
                const names = new Set(rows.map(r => r.children[0].textContent));
                return {rows: rows.length, distinct: names.size,
                        allOnePending: rows.every(r => r.children[1].textContent === '1'),
                        first: rows[0].children[0].textContent,
                        last: rows[rows.length - 1].children[0].textContent};";
    browser.open(&env.url("/queues/wide")).await;
    assert_eq!(browser.text("#partition-count").await, "10000");
    assert_eq!(browser.text("#partition-range").await, "1–500");
    assert_eq!(
        browser.eval(rows).await,
        json!({"rows": 500, "distinct": 500, "allOnePending": true,
               "first": "p00000", "last": "p00499"})
    );
    let pending = browser.text(".cards .card:first-child .value").await;
    assert_eq!(pending, "10,000");
    browser.screenshot("queue-10000-partitions").await;

    // The next page follows on; the last one ends with the last partition.
    browser.click("nav.pager a[rel=next]").await;
    browser
        .wait_text("#partition-range", |t| t == "501–1,000")
        .await;
    let second = browser.eval(rows).await;
    assert_eq!(second["first"], "p00500", "{second}");
    browser.open(&env.url("/queues/wide?offset=9500")).await;
    assert_eq!(browser.text("#partition-range").await, "9,501–10,000");
    assert_eq!(
        browser.eval(rows).await,
        json!({"rows": 500, "distinct": 500, "allOnePending": true,
               "first": "p09500", "last": "p09999"})
    );
    browser.close().await;
}

#[tokio::test]
async fn pages_fit_a_phone_screen() {
    let env = Env::start().await;
    env.push(json!([{"queue": "orders", "payload": {"n": 1}}]))
        .await;
    let browser = Browser::start().await;
    browser.client.set_window_size(390, 844).await.unwrap();
    for (path, name) in [("/", "phone-overview"), ("/queues", "phone-queues")] {
        browser.open(&env.url(path)).await;
        browser.text("h1").await;
        // Nothing wider than the screen but the tables' own scroll areas.
        let overflow = browser
            .eval("return document.documentElement.scrollWidth - document.documentElement.clientWidth")
            .await;
        assert_eq!(overflow, json!(0), "{path} scrolls sideways");
        browser.screenshot(name).await;
    }
    // Every control is reachable by keyboard: the first Tab lands on the skip link.
    browser
        .client
        .find(Locator::Css("body"))
        .await
        .unwrap()
        .send_keys("\u{E004}")
        .await
        .unwrap();
    let focused = browser
        .eval("return document.activeElement.textContent")
        .await;
    assert_eq!(focused, json!("Skip to content"));
    browser.close().await;
}

/// A dead letter in queue `jobs` (transaction id `job-42`, pushed with `token`), and the
/// partition id it lives in.
async fn dead_letter_with(env: &Env, token: &str) -> String {
    use super::auth::{expect, push_then_pop};
    let push = json!([{"queue": "jobs", "partition": "p1", "transactionId": "job-42",
                       "payload": {"job": "resize", "id": 42}}]);
    let pop = push_then_pop(env, token, push, "/api/v1/pop/queue/jobs?batch=1").await;
    let m = &pop["messages"][0];
    let ack = json!({"transactionId": "job-42", "partitionId": m["partitionId"],
                     "leaseId": m["leaseId"], "status": "dlq", "error": "image too large"});
    expect(
        env,
        "POST",
        "/api/v1/ack",
        Some(token),
        Some(ack),
        StatusCode::OK,
    )
    .await;
    m["partitionId"].as_str().unwrap().to_string()
}

impl Browser {
    /// Signs in on the sign-in page the browser is on, with `token`.
    async fn sign_in(&self, token: &str) {
        self.find("#token")
            .await
            .send_keys(token)
            .await
            .expect("typing the token");
        self.click("#sign-in button[type=submit]").await;
    }

    /// The path of the page the browser shows.
    async fn path(&self) -> String {
        self.client.current_url().await.unwrap().path().to_string()
    }
}

#[tokio::test]
async fn with_tokens_the_pages_ask_for_one_and_an_admin_requeues_from_them() {
    use super::auth::{claims, expect, hs256, hs256_server};
    let env = hs256_server(&[]).await;
    let admin = hs256(&claims("ops", "admin"));
    let pid = dead_letter_with(&env, &admin).await;

    // Unauthenticated: the page asked for leads to the sign-in page, which says why.
    let browser = Browser::start().await;
    browser.open(&env.url("/dead-letters?queue=jobs")).await;
    browser.find("#sign-in").await;
    assert_eq!(browser.path().await, "/sign-in");
    let why = browser.text("#sign-in-message").await;
    assert!(why.contains("requires a bearer token"), "{why}");
    browser.screenshot("sign-in").await;

    // A bad token: the form again with a sentence, not a JSON error, and nothing of it
    // written back.
    browser.sign_in("not.a.token").await;
    browser
        .wait_text("#sign-in-message", |t| t.contains("not valid"))
        .await;
    let html = browser.client.source().await.unwrap();
    assert!(!html.contains("not.a.token"), "the token is echoed");
    assert!(!html.contains("\"code\""), "a JSON error");

    // The administrator's token: back to the page asked for, with its buttons.
    browser.sign_in(&admin).await;
    assert_eq!(browser.text("#dlq-total").await, "1");
    assert_eq!(browser.path().await, "/dead-letters");
    let cookies = browser.eval("return document.cookie").await;
    assert!(
        !cookies.as_str().unwrap().contains("comb_token"),
        "scripts cannot read the token: {cookies}"
    );
    browser.click("#dead-letters .entry button.requeue").await;
    browser.click("#confirm-yes").await;
    let notice = browser.text(".notice").await;
    assert!(notice.starts_with("Requeued 1 dead letter"), "{notice}");
    let pop = expect(
        &env,
        "GET",
        "/api/v1/pop/queue/jobs?batch=1&wait=true&timeout=30000",
        Some(&admin),
        None,
        StatusCode::OK,
    )
    .await
    .json();
    assert_eq!(pop["messages"][0]["transactionId"], "job-42");

    // The message's page names its producer, the token's subject.
    browser
        .open(&env.url(&format!("/messages/{pid}/job-42")))
        .await;
    browser.find("#payload").await;
    let producer = browser
        .eval("return [...document.querySelectorAll('dl.options div')].find(d => d.querySelector('dt').textContent === 'Producer').querySelector('dd').textContent")
        .await;
    assert_eq!(producer, json!("ops"));

    // Signing out forgets the token: the pages ask again.
    browser.click("#sign-out").await;
    browser
        .wait_text("#sign-in-message", |t| t.contains("signed out"))
        .await;
    browser.open(&env.url("/")).await;
    browser.find("#sign-in").await;
    assert_eq!(browser.path().await, "/sign-in");
    browser.close().await;
}

#[tokio::test]
async fn a_read_only_token_sees_the_pages_without_destructive_buttons_and_cannot_post() {
    use super::auth::{claims, expect, hs256, hs256_server, now};
    let env = hs256_server(&[]).await;
    let admin = hs256(&claims("ops", "admin"));
    let reader = hs256(&claims("auditor", "read-only"));
    dead_letter_with(&env, &admin).await;
    expect(
        &env,
        "GET",
        "/api/v1/pop/queue/jobs?consumerGroup=analytics&subscriptionMode=all&autoAck=true",
        Some(&admin),
        None,
        StatusCode::OK,
    )
    .await;

    let browser = Browser::start().await;
    browser.open(&env.url("/sign-in")).await;
    browser.sign_in(&reader).await;
    // The overview (whose total only it shows), not the sign-in page still on screen.
    browser.find("#total-depth").await;
    assert_eq!(browser.path().await, "/");
    browser.open(&env.url("/dead-letters?queue=jobs")).await;
    assert_eq!(browser.text("#dlq-total").await, "1");
    let entry = browser.text("#dead-letters .entry summary").await;
    assert!(entry.contains("image too large"), "{entry}");
    let buttons = browser
        .eval("return document.querySelectorAll('button.requeue, button.purge, #requeue-all, #purge-all').length")
        .await;
    assert_eq!(buttons, json!(0));
    assert_eq!(browser.text(".badge").await, "read-only");
    browser.screenshot("dead-letters-read-only").await;
    browser.open(&env.url("/groups")).await;
    let rows = browser.text("#groups tbody").await;
    assert!(rows.contains("analytics"), "{rows}");
    let seeks = browser
        .eval("return document.querySelectorAll('form.seek').length")
        .await;
    assert_eq!(seeks, json!(0));
    browser.close().await;

    // A forged action with the reader's token and a valid CSRF pair, by cookie or by header:
    // refused, and the API refuses the reader too.
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let csrf = "0123456789abcdef0123456789abcdef";
    for (cookie, authorization) in [
        (format!("comb_csrf={csrf}; comb_token={reader}"), None),
        (
            format!("comb_csrf={csrf}"),
            Some(format!("Bearer {reader}")),
        ),
    ] {
        let mut req = http
            .post(env.url("/dead-letters/requeue"))
            .header("cookie", cookie)
            .header("x-comb-csrf", csrf)
            .form(&[("queue", "jobs")]);
        if let Some(a) = authorization {
            req = req.header("authorization", a);
        }
        let r = req.send().await.unwrap();
        assert_eq!(r.status(), StatusCode::FORBIDDEN);
        assert!(r.text().await.unwrap().contains("may only look"));
    }
    let refused = expect(
        &env,
        "POST",
        "/api/v1/dlq/requeue",
        Some(&reader),
        Some(json!({"queue": "jobs"})),
        StatusCode::FORBIDDEN,
    )
    .await;
    assert!(refused.text.contains("forbidden"), "{}", refused.text);
    let dlq = expect(
        &env,
        "GET",
        "/api/v1/dlq?queue=jobs",
        Some(&admin),
        None,
        StatusCode::OK,
    )
    .await
    .json();
    assert_eq!(dlq["total"], 1, "nothing was requeued");

    // An expired token in the cookie leads to the sign-in page (and the cookie is ended); a
    // live refresh by htmx is told where to go instead of getting a fragment.
    let mut old = claims("auditor", "read-only");
    old["exp"] = json!(now() - 3600);
    let expired = hs256(&old);
    let r = http
        .get(env.url("/queues"))
        .header("cookie", format!("comb_token={expired}"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let to = r.headers()["location"].to_str().unwrap();
    assert_eq!(to, "/sign-in?why=invalid&next=%2Fqueues");
    let ended = r.headers()["set-cookie"].to_str().unwrap();
    assert!(
        ended.starts_with("comb_token=;") && ended.contains("Max-Age=0"),
        "{ended}"
    );
    let r = http
        .get(env.url("/dead-letters?queue=jobs"))
        .header("cookie", format!("comb_token={expired}"))
        .header("hx-request", "true")
        .header("hx-current-url", env.url("/dead-letters?queue=jobs"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    let to = r.headers()["hx-redirect"].to_str().unwrap();
    assert!(
        to.starts_with("/sign-in?why=invalid&next=%2Fdead-letters"),
        "{to}"
    );
    // The sign-in page itself says why.
    let page = http.get(env.url(to)).send().await.unwrap();
    assert_eq!(page.status(), StatusCode::OK);
    assert!(page.text().await.unwrap().contains("may have expired"));
}
