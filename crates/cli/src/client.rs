//! `comb` as a client of a running server: queues, messages, dead letters and consumer
//! groups from the command line, over the HTTP API (`--url` or `COMB_URL`).
//!
//! Human tables by default, `--json` for scripts (the server's answer as it came). Tables
//! are printed from the server's own answer types (`comb::wire`), read back with serde, so
//! the client cannot drift from the server's field names: a field the server stops writing
//! fails the command as an unreadable answer instead of printing an empty column. Colour
//! only when standard output is a terminal. Exit codes: 0 done, 1 the server failed or could
//! not be reached, 3 not found, 4 the request was refused as wrong (clap's usage errors
//! exit 2).

use std::io::{IsTerminal, Read, Write};
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use clap::{Args, Subcommand};
use comb::wire::{
    GroupSummary, ListedMessage, MessageListing, Problem, PurgeAnswer, PushResult, QueueDetail,
    QueueList, RequeueAnswer, Sought,
};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

/// Exit code: the server failed or could not be reached.
pub(crate) const EXIT_FAILED: i32 = 1;
/// Exit code: what was named does not exist.
pub(crate) const EXIT_NOT_FOUND: i32 = 3;
/// Exit code: the server refused the request as wrong.
pub(crate) const EXIT_REFUSED: i32 = 4;

/// Where the server is and how to print, for every client command.
#[derive(Debug, Clone, Args)]
pub(crate) struct Client {
    /// The server's base URL.
    #[arg(
        long,
        env = "COMB_URL",
        default_value = "http://127.0.0.1:6632",
        global = true
    )]
    pub url: String,
    /// Print the server's JSON answers instead of tables.
    #[arg(long, global = true)]
    pub json: bool,
}

/// The client commands.
#[derive(Debug, Subcommand)]
pub(crate) enum ClientCommand {
    /// List queues with depth, in flight, dead letters and oldest pending age.
    Queues {
        #[command(flatten)]
        client: Client,
    },
    /// One queue: its partitions and the lag of each consumer group.
    Queue {
        name: String,
        #[command(flatten)]
        client: Client,
    },
    /// Push a message: a JSON payload, or `-` to read it from standard input.
    Push {
        queue: String,
        payload: String,
        #[arg(long)]
        partition: Option<String>,
        #[command(flatten)]
        client: Client,
    },
    /// Follow new messages of a queue as they are pushed, without consuming them (their
    /// status is shown for `--group`).
    Tail {
        queue: String,
        #[arg(long)]
        group: Option<String>,
        #[command(flatten)]
        client: Client,
    },
    /// Dead letters: list, requeue, purge.
    Dlq {
        #[command(subcommand)]
        action: DlqAction,
    },
    /// List consumer groups with their lag.
    Groups {
        #[command(flatten)]
        client: Client,
    },
    /// One consumer group: seek.
    Group {
        #[command(subcommand)]
        action: GroupAction,
    },
    /// List messages of a queue, by partition, status and group.
    Messages {
        queue: String,
        #[arg(long)]
        partition: Option<String>,
        /// pending, processing, completed or dead_letter.
        #[arg(long)]
        status: Option<String>,
        #[arg(long)]
        group: Option<String>,
        #[arg(long, default_value_t = 50)]
        limit: u64,
        #[command(flatten)]
        client: Client,
    },
}

/// Which dead letters.
#[derive(Debug, Clone, Args)]
pub(crate) struct DlqSelection {
    pub queue: String,
    #[arg(long)]
    pub group: Option<String>,
    #[arg(long)]
    pub partition: Option<String>,
    /// Only these entries (repeatable).
    #[arg(long = "id")]
    pub ids: Vec<String>,
}

/// What to do with dead letters.
#[derive(Debug, Subcommand)]
pub(crate) enum DlqAction {
    /// List a queue's dead letters (of `--group`, default the queue mode group).
    List {
        #[command(flatten)]
        selection: DlqSelection,
        #[arg(long, default_value_t = 50)]
        limit: u64,
        #[command(flatten)]
        client: Client,
    },
    /// Store dead letters again at the end of their partitions, in their original order.
    Requeue {
        #[command(flatten)]
        selection: DlqSelection,
        #[command(flatten)]
        client: Client,
    },
    /// Delete dead letters.
    Purge {
        #[command(flatten)]
        selection: DlqSelection,
        #[command(flatten)]
        client: Client,
    },
}

/// What to do with a consumer group.
#[derive(Debug, Subcommand)]
pub(crate) enum GroupAction {
    /// Move the group's cursors of a queue (or one partition) to the end, the start or a time.
    Seek {
        group: String,
        queue: String,
        #[arg(long)]
        partition: Option<String>,
        #[arg(long, conflicts_with_all = ["start", "time"])]
        end: bool,
        #[arg(long, conflicts_with = "time")]
        start: bool,
        /// RFC 3339 time or date.
        #[arg(long)]
        time: Option<String>,
        #[command(flatten)]
        client: Client,
    },
}

/// A failed command: its message and exit code.
struct Failed(String, i32);

type Outcome = Result<(), Failed>;

/// Runs a client command; returns the process's exit code.
pub(crate) async fn run(command: ClientCommand) -> i32 {
    match command_run(command).await {
        Ok(()) => 0,
        Err(Failed(message, code)) => {
            eprintln!("comb: {message}");
            code
        }
    }
}

fn encode(segment: &str) -> String {
    let mut out = String::new();
    for b in segment.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

struct Http {
    base: String,
    client: reqwest::Client,
}

impl Http {
    fn new(c: &Client) -> Http {
        Http {
            base: c.url.trim_end_matches('/').to_string(),
            client: reqwest::Client::builder()
                .timeout(Duration::from_secs(60))
                .build()
                .expect("HTTP client"),
        }
    }

    /// The answer's bytes, or the failure a refusal (read as the server's problem type) or
    /// an unreachable server means.
    async fn send_bytes(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Vec<u8>, Failed> {
        let url = format!("{}{path}", self.base);
        let mut request = self.client.request(method, &url);
        if let Some(b) = body {
            request = request.json(b);
        }
        let response = request
            .send()
            .await
            .map_err(|e| Failed(format!("cannot reach {url}: {e}"), EXIT_FAILED))?;
        let status = response.status();
        let bytes = response
            .bytes()
            .await
            .map_err(|e| Failed(format!("reading the answer of {url}: {e}"), EXIT_FAILED))?;
        if status.is_success() {
            return Ok(bytes.to_vec());
        }
        let detail = match serde_json::from_slice::<Problem>(&bytes) {
            Ok(problem) => problem.detail,
            Err(_) => String::from_utf8_lossy(&bytes).into_owned(),
        };
        let code = match status.as_u16() {
            404 => EXIT_NOT_FOUND,
            400..=499 => EXIT_REFUSED,
            _ => EXIT_FAILED,
        };
        Err(Failed(format!("{} ({status})", detail), code))
    }

    /// The answer as JSON.
    async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Value, Failed> {
        let bytes = self.send_bytes(method, path, body).await?;
        Ok(if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes)
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into()))
        })
    }

    async fn get(&self, path: &str) -> Result<Value, Failed> {
        self.send(reqwest::Method::GET, path, None).await
    }

    async fn post(&self, path: &str, body: &Value) -> Result<Value, Failed> {
        self.send(reqwest::Method::POST, path, Some(body)).await
    }
}

/// Prints a table: a header row and rows of cells, columns padded; the header bold on a
/// terminal.
fn table(header: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            widths[i] = widths[i].max(c.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        cells
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c:<w$}", w = widths[i]))
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_string()
    };
    let mut out = std::io::stdout().lock();
    let head = line(header.iter().map(|h| h.to_string()).collect());
    if std::io::stdout().is_terminal() {
        let _ = writeln!(out, "\x1b[1m{head}\x1b[0m");
    } else {
        let _ = writeln!(out, "{head}");
    }
    for r in rows {
        let _ = writeln!(out, "{}", line(r.clone()));
    }
}

/// The server's answer read as its type: the same type the server wrote it from.
fn typed<T: DeserializeOwned>(v: &Value, what: &str) -> Result<T, Failed> {
    T::deserialize(v).map_err(|e| {
        Failed(
            format!("the server's answer is not a {what}: {e}"),
            EXIT_FAILED,
        )
    })
}

/// A figure as the server writes it: whole numbers without a fraction, others to one place.
fn figure(x: f64) -> String {
    if x.fract() == 0.0 && x.abs() < 9.0e15 {
        (x as i64).to_string()
    } else {
        format!("{x:.1}")
    }
}

/// A value that may be absent: `-` when it is.
fn opt<T: std::fmt::Display>(x: Option<T>) -> String {
    x.map_or_else(|| "-".into(), |x| x.to_string())
}

/// A time as the server writes it (UTC, milliseconds, `Z`).
fn time(t: &DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// A message listing's rows: partition, position, transaction, status, created, payload.
fn message_row(m: &ListedMessage) -> Vec<String> {
    vec![
        m.partition.clone(),
        m.position.to_string(),
        m.transaction_id.clone(),
        m.status.clone(),
        time(&m.created_at),
        cell(&m.data),
    ]
}

fn cell(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) => s.clone(),
        Value::Number(n) => match n.as_f64() {
            Some(f) if n.is_f64() => format!("{f:.1}"),
            _ => n.to_string(),
        },
        other => other.to_string(),
    }
}

fn print_json(v: &Value) {
    println!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
}

fn query(pairs: &[(&str, Option<String>)]) -> String {
    let parts: Vec<String> = pairs
        .iter()
        .filter_map(|(k, v)| v.as_ref().map(|v| format!("{k}={}", encode(v))))
        .collect();
    if parts.is_empty() {
        String::new()
    } else {
        format!("?{}", parts.join("&"))
    }
}

fn selection_body(s: &DlqSelection) -> Value {
    json!({
        "queue": s.queue,
        "consumerGroup": s.group,
        "partition": s.partition,
        "ids": if s.ids.is_empty() { Value::Null } else { json!(s.ids) },
    })
}

async fn command_run(command: ClientCommand) -> Outcome {
    match command {
        ClientCommand::Queues { client } => {
            let http = Http::new(&client);
            let v = http.get("/api/v1/resources/queues?limit=1000").await?;
            if client.json {
                print_json(&v);
                return Ok(());
            }
            let list: QueueList = typed(&v, "queue list")?;
            let rows: Vec<Vec<String>> = list
                .queues
                .iter()
                .map(|q| {
                    vec![
                        q.name.clone(),
                        opt(q.partitions),
                        opt(q.messages.pending),
                        opt(q.messages.processing),
                        opt(q.dead_letters),
                        figure(q.oldest_pending_age_seconds),
                    ]
                })
                .collect();
            table(
                &[
                    "QUEUE",
                    "PARTITIONS",
                    "PENDING",
                    "IN FLIGHT",
                    "DEAD",
                    "OLDEST (s)",
                ],
                &rows,
            );
            Ok(())
        }
        ClientCommand::Queue { name, client } => {
            let http = Http::new(&client);
            let v = http
                .get(&format!(
                    "/api/v1/resources/queues/{}?limit=1000",
                    encode(&name)
                ))
                .await?;
            if client.json {
                print_json(&v);
                return Ok(());
            }
            let detail: QueueDetail = typed(&v, "queue")?;
            let parts: Vec<Vec<String>> = detail
                .partition_list
                .iter()
                .map(|p| &p.figures)
                .map(|p| {
                    vec![
                        p.name.clone(),
                        opt(p.messages.total),
                        opt(p.messages.pending),
                        opt(p.messages.processing),
                        figure(p.oldest_pending_age_seconds),
                    ]
                })
                .collect();
            table(
                &[
                    "PARTITION",
                    "MESSAGES",
                    "PENDING",
                    "IN FLIGHT",
                    "OLDEST (s)",
                ],
                &parts,
            );
            println!();
            let groups: Vec<Vec<String>> = detail
                .consumer_groups
                .iter()
                .map(|g| {
                    vec![
                        g.name.clone(),
                        g.lag.to_string(),
                        figure(g.lag_seconds),
                        g.leased_partitions.to_string(),
                    ]
                })
                .collect();
            table(&["GROUP", "LAG", "LAG (s)", "LEASED"], &groups);
            Ok(())
        }
        ClientCommand::Push {
            queue,
            payload,
            partition,
            client,
        } => {
            let text = if payload == "-" {
                let mut s = String::new();
                std::io::stdin()
                    .read_to_string(&mut s)
                    .map_err(|e| Failed(format!("reading standard input: {e}"), EXIT_FAILED))?;
                s
            } else {
                payload
            };
            let data: Value = serde_json::from_str(&text)
                .map_err(|e| Failed(format!("the payload is not JSON: {e}"), EXIT_REFUSED))?;
            let http = Http::new(&client);
            let bytes = http
                .send_bytes(
                    reqwest::Method::POST,
                    "/api/v1/push",
                    Some(&json!({"items": [{"queue": queue, "partition": partition, "payload": data}]})),
                )
                .await?;
            let results: Vec<PushResult> = serde_json::from_slice(&bytes).map_err(|e| {
                Failed(
                    format!("the server's answer is not a push answer: {e}"),
                    EXIT_FAILED,
                )
            })?;
            if client.json {
                print_json(&serde_json::to_value(&results).unwrap_or_default());
            } else {
                let rows: Vec<Vec<String>> = results
                    .iter()
                    .map(|r| {
                        vec![
                            r.status().as_str().to_string(),
                            r.transaction_id(),
                            r.partition_id().to_string(),
                        ]
                    })
                    .collect();
                table(&["STATUS", "TRANSACTION", "PARTITION ID"], &rows);
            }
            Ok(())
        }
        ClientCommand::Tail {
            queue,
            group,
            client,
        } => tail(&Http::new(&client), &queue, group, client.json).await,
        ClientCommand::Dlq { action } => dlq(action).await,
        ClientCommand::Groups { client } => {
            let http = Http::new(&client);
            let v = http.get("/api/v1/consumer-groups").await?;
            if client.json {
                print_json(&v);
                return Ok(());
            }
            let groups: Vec<GroupSummary> = typed(&v, "consumer group list")?;
            let mut rows = Vec::new();
            for g in &groups {
                for q in &g.queues {
                    rows.push(vec![
                        g.name.clone(),
                        q.queue.clone(),
                        q.partitions.to_string(),
                        q.lag.to_string(),
                        figure(q.lag_seconds),
                    ]);
                }
            }
            table(&["GROUP", "QUEUE", "PARTITIONS", "LAG", "LAG (s)"], &rows);
            Ok(())
        }
        ClientCommand::Group {
            action:
                GroupAction::Seek {
                    group,
                    queue,
                    partition,
                    end,
                    start,
                    time,
                    client,
                },
        } => {
            let body = match (end, start, time) {
                (true, _, _) => json!({"toEnd": true}),
                (_, true, _) => json!({"toStart": true}),
                (_, _, Some(t)) => json!({"timestamp": t}),
                _ => {
                    return Err(Failed(
                        "say where to: --end, --start or --time".into(),
                        EXIT_REFUSED,
                    ));
                }
            };
            let path = match &partition {
                Some(p) => format!(
                    "/api/v1/consumer-groups/{}/queues/{}/partitions/{}/seek",
                    encode(&group),
                    encode(&queue),
                    encode(p)
                ),
                None => format!(
                    "/api/v1/consumer-groups/{}/queues/{}/seek",
                    encode(&group),
                    encode(&queue)
                ),
            };
            let v = Http::new(&client).post(&path, &body).await?;
            if client.json {
                print_json(&v);
            } else {
                let sought: Sought = typed(&v, "seek answer")?;
                table(
                    &["GROUP", "QUEUE", "PARTITIONS MOVED", "LAG"],
                    &[vec![
                        group,
                        queue,
                        sought.partitions_moved.to_string(),
                        sought.lag.to_string(),
                    ]],
                );
            }
            Ok(())
        }
        ClientCommand::Messages {
            queue,
            partition,
            status,
            group,
            limit,
            client,
        } => {
            let http = Http::new(&client);
            let path = format!(
                "/api/v1/messages{}",
                query(&[
                    ("queue", Some(queue)),
                    ("partition", partition),
                    ("status", status),
                    ("consumerGroup", group),
                    ("limit", Some(limit.to_string())),
                ])
            );
            let v = http.get(&path).await?;
            if client.json {
                print_json(&v);
            } else {
                let listing: MessageListing = typed(&v, "message listing")?;
                print_messages(&listing);
            }
            Ok(())
        }
    }
}

fn print_messages(listing: &MessageListing) {
    let rows: Vec<Vec<String>> = listing.messages.iter().map(message_row).collect();
    table(
        &[
            "PARTITION",
            "POS",
            "TRANSACTION",
            "STATUS",
            "CREATED",
            "DATA",
        ],
        &rows,
    );
}

async fn dlq(action: DlqAction) -> Outcome {
    match action {
        DlqAction::List {
            selection,
            limit,
            client,
        } => {
            let http = Http::new(&client);
            let path = format!(
                "/api/v1/messages{}",
                query(&[
                    ("queue", Some(selection.queue.clone())),
                    ("partition", selection.partition.clone()),
                    ("status", Some("dead_letter".into())),
                    ("consumerGroup", selection.group.clone()),
                    ("limit", Some(limit.to_string())),
                ])
            );
            let v = http.get(&path).await?;
            if client.json {
                print_json(&v);
                return Ok(());
            }
            let listing: MessageListing = typed(&v, "message listing")?;
            let rows: Vec<Vec<String>> = listing
                .messages
                .iter()
                .map(|m| {
                    vec![
                        m.partition.clone(),
                        m.transaction_id.clone(),
                        opt(m.retry_count),
                        opt(m.moved_to_dlq_at.as_ref().map(time)),
                        opt(m.error_message.clone().flatten()),
                    ]
                })
                .collect();
            table(
                &[
                    "PARTITION",
                    "TRANSACTION",
                    "ATTEMPTS",
                    "DEAD SINCE",
                    "ERROR",
                ],
                &rows,
            );
            Ok(())
        }
        DlqAction::Requeue { selection, client } => {
            let v = Http::new(&client)
                .post("/api/v1/dlq/requeue", &selection_body(&selection))
                .await?;
            if client.json {
                print_json(&v);
            } else {
                let answer: RequeueAnswer = typed(&v, "requeue answer")?;
                table(
                    &["QUEUE", "REQUEUED", "REMAINING"],
                    &[vec![
                        selection.queue,
                        answer.requeued.to_string(),
                        answer.remaining.to_string(),
                    ]],
                );
            }
            Ok(())
        }
        DlqAction::Purge { selection, client } => {
            let v = Http::new(&client)
                .post("/api/v1/dlq/purge", &selection_body(&selection))
                .await?;
            if client.json {
                print_json(&v);
            } else {
                let answer: PurgeAnswer = typed(&v, "purge answer")?;
                table(
                    &["QUEUE", "PURGED"],
                    &[vec![selection.queue, answer.purged.to_string()]],
                );
            }
            Ok(())
        }
    }
}

/// Polls the queue's newest messages every half second and prints those not seen before,
/// oldest first. Reads only: no cursor moves.
async fn tail(http: &Http, queue: &str, group: Option<String>, as_json: bool) -> Outcome {
    let since = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
    let mut seen = std::collections::HashSet::new();
    let mut header = !as_json;
    loop {
        let path = format!(
            "/api/v1/messages{}",
            query(&[
                ("queue", Some(queue.to_string())),
                ("consumerGroup", group.clone()),
                ("from", Some(since.clone())),
                ("limit", Some("1000".into())),
            ])
        );
        let v = http.get(&path).await?;
        // Each message read as its type, beside the server's own JSON for `--json`.
        let raw = v["messages"].as_array().cloned().unwrap_or_default();
        let mut fresh = Vec::new();
        for m in raw {
            let typed: ListedMessage = typed(&m, "listed message")?;
            if seen.insert((typed.partition_id, typed.position)) {
                fresh.push((typed, m));
            }
        }
        fresh.sort_by_key(|(m, _)| (m.created_at, m.position));
        for (m, raw) in fresh {
            if as_json {
                println!("{raw}");
            } else {
                if header {
                    table(
                        &[
                            "PARTITION",
                            "POS",
                            "TRANSACTION",
                            "STATUS",
                            "CREATED",
                            "DATA",
                        ],
                        &[],
                    );
                    header = false;
                }
                println!(
                    "{}  {}  {}  {}  {}  {}",
                    m.partition,
                    m.position,
                    m.transaction_id,
                    m.status,
                    time(&m.created_at),
                    m.data
                );
            }
        }
        let _ = std::io::stdout().flush();
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
