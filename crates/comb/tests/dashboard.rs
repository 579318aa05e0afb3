//! The dashboard in a real browser: headless Chromium (Debian's `chromium` and
//! `chromium-driver`, installed by `make test`) driven over WebDriver against a real
//! `comb serve` on a real PostgreSQL. Screenshots go to `target/screenshots/`.

mod common;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::Env;
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
        let deadline = Instant::now() + Duration::from_secs(30);
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

    /// The text of the first element matching `css`, waiting up to 10 s for one.
    async fn text(&self, css: &str) -> String {
        self.client
            .wait()
            .at_most(Duration::from_secs(10))
            .for_element(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("no {css}: {e}"))
            .text()
            .await
            .unwrap()
    }

    /// Waits up to 15 s for the text of `css` to satisfy `ok`; returns the last text seen.
    async fn wait_text(&self, css: &str, ok: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(15);
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
        self.client
            .wait()
            .at_most(Duration::from_secs(10))
            .for_element(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("no {css}: {e}"))
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
    let env = Env::start().await;
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
        .pop("/api/v1/pop/queue/jobs?batch=1&wait=true&timeout=5000")
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
