//! Bad input never hurts: requests generated from the server's own OpenAPI description and
//! then broken on purpose, plus hand-written edge cases, each checked for a clear answer.
//!
//! For every route of `GET /api/v1/openapi.json` the generator builds a plausible request
//! from the schemas (real queue names, partition ids and lease ids some of the time, so that
//! requests get past the first check), then mutates it: hostile values (nulls, huge numbers,
//! quotes, slashes, SQL, control characters, deep nesting), missing and unknown members,
//! wrong types, truncated or non-UTF-8 bodies, hostile path and query values. Hand-written
//! cases add bodies past 16 MiB (sized and chunked), 100,000-item batches, deep nesting and
//! wrong methods.
//!
//! Each answer must be below 500, every error must be `application/problem+json` with
//! `type`, `title`, `status` (equal to the HTTP status), `detail`, a non-empty `code` and
//! `error` equal to `detail`, and a refused request (4xx) must leave the database exactly as
//! it was. At the end the server must still be running and healthy.
//!
//! Requests go over raw TCP, so that bodies may be invalid UTF-8, truncated, chunked or far
//! beyond the limit, and an early answer to an oversized body is still read.
//!
//! Against a server that requires bearer tokens ([`against_new_server_with_tokens`]), most
//! cases carry a valid administrator's token and the others a broken `Authorization` header
//! (none, another scheme, expired, signed with another key, `alg: none`, tampered, bytes
//! that are not UTF-8); those must get 401 on every route but the public ones.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde_json::{Map, Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::rng::Rng;

/// A request body as sent on the wire.
#[derive(Debug, Clone)]
pub enum Body {
    None,
    /// Sent with `Content-Length`.
    Sized(Vec<u8>),
    /// Sent with `Transfer-Encoding: chunked`, in 64 KiB chunks.
    Chunked(Vec<u8>),
}

/// One request to send.
#[derive(Debug, Clone)]
pub struct Case {
    /// What the case is, for reports.
    pub name: String,
    pub method: String,
    /// Path and query, already percent-encoded where needed.
    pub target: String,
    pub body: Body,
    /// The status the case must get, when it is certain.
    pub expect: Option<u16>,
}

/// An HTTP answer.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    /// Header names in lower case.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// How long one request may take before it counts as hanging.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(20);

/// Sends one request over a fresh connection and reads the whole answer.
pub async fn send(addr: SocketAddr, case: &Case) -> std::io::Result<Answer> {
    send_with(addr, case, None).await
}

/// Like [`send`], with an `Authorization` header of these bytes.
pub async fn send_with(
    addr: SocketAddr,
    case: &Case,
    authorization: Option<&[u8]>,
) -> std::io::Result<Answer> {
    tokio::time::timeout(REQUEST_TIMEOUT, exchange(addr, case, authorization))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "no answer"))?
}

async fn exchange(
    addr: SocketAddr,
    case: &Case,
    authorization: Option<&[u8]>,
) -> std::io::Result<Answer> {
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    let mut head = format!(
        "{} {} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n",
        case.method, case.target
    )
    .into_bytes();
    if let Some(a) = authorization {
        // Sent as given, bytes that are not UTF-8 included.
        head.extend_from_slice(b"Authorization: ");
        head.extend_from_slice(a);
        head.extend_from_slice(b"\r\n");
    }
    match &case.body {
        Body::None => {}
        Body::Sized(b) => head.extend_from_slice(
            format!(
                "Content-Type: application/json\r\nContent-Length: {}\r\n",
                b.len()
            )
            .as_bytes(),
        ),
        Body::Chunked(_) => head
            .extend_from_slice(b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n"),
    }
    head.extend_from_slice(b"\r\n");
    // The server may answer (413) and close before the body is all sent: a failed write is
    // fine as long as the answer can be read.
    let written = async {
        s.write_all(&head).await?;
        match &case.body {
            Body::None => {}
            Body::Sized(b) => s.write_all(b).await?,
            Body::Chunked(b) => {
                for chunk in b.chunks(64 * 1024) {
                    s.write_all(format!("{:x}\r\n", chunk.len()).as_bytes())
                        .await?;
                    s.write_all(chunk).await?;
                    s.write_all(b"\r\n").await?;
                }
                s.write_all(b"0\r\n\r\n").await?;
            }
        }
        Ok::<(), std::io::Error>(())
    }
    .await;
    let mut raw = Vec::new();
    let read = s.read_to_end(&mut raw).await;
    if raw.is_empty() {
        written?;
        read?;
    }
    parse_answer(&raw)
}

fn parse_answer(raw: &[u8]) -> std::io::Result<Answer> {
    let bad = |m: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, m.to_string());
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| bad("no end of head"))?;
    let head = String::from_utf8_lossy(&raw[..end]);
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad("no status"))?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let mut body = raw[end + 4..].to_vec();
    if headers
        .iter()
        .any(|(n, v)| n == "transfer-encoding" && v.contains("chunked"))
    {
        body = dechunk(&body);
    }
    Ok(Answer {
        status,
        headers,
        body,
    })
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(eol) = b.windows(2).position(|w| w == b"\r\n") {
        let size = usize::from_str_radix(String::from_utf8_lossy(&b[..eol]).trim(), 16);
        let Ok(size) = size else { break };
        if size == 0 || b.len() < eol + 2 + size {
            break;
        }
        out.extend_from_slice(&b[eol + 2..eol + 2 + size]);
        b = &b[(eol + 4 + size).min(b.len())..];
    }
    out
}

/// What is wrong with an answer to `case`, if anything (besides database changes).
pub fn judge(case: &Case, a: &Answer) -> Option<String> {
    if let Some(expect) = case.expect
        && a.status != expect
    {
        return Some(format!("expected {expect}, got {}", a.status));
    }
    if a.status >= 500 {
        return Some(format!(
            "server error {}: {}",
            a.status,
            String::from_utf8_lossy(&a.body[..a.body.len().min(300)])
        ));
    }
    if a.status < 400 {
        return None;
    }
    let ct = a.header("content-type").unwrap_or("");
    if !ct.starts_with("application/problem+json") {
        return Some(format!(
            "{} with content-type {ct:?}, not problem+json: {:?}",
            a.status,
            String::from_utf8_lossy(&a.body[..a.body.len().min(200)])
        ));
    }
    let Ok(p) = serde_json::from_slice::<Value>(&a.body) else {
        return Some(format!("{} with a body that is not JSON", a.status));
    };
    let ok = p["status"].as_u64() == Some(a.status as u64)
        && p["type"].is_string()
        && p["title"].is_string()
        && p["detail"].is_string()
        && p["code"].as_str().is_some_and(|c| !c.is_empty())
        && p["error"] == p["detail"];
    (!ok).then(|| format!("{} with an incomplete problem: {p}", a.status))
}

/// Real ids for requests to use, so that some get past the first checks.
#[derive(Debug, Clone, Default)]
pub struct Context {
    pub queues: Vec<String>,
    pub partitions: Vec<String>,
    pub groups: Vec<String>,
    pub partition_ids: Vec<String>,
    pub lease_ids: Vec<String>,
    pub transaction_ids: Vec<String>,
}

/// Strings that have broken servers before.
pub const HOSTILE_STRINGS: &[&str] = &[
    "",
    " ",
    "'",
    "\"",
    "q'uote",
    "dq\"uote",
    "slash/es",
    "../../etc/passwd",
    "back\\slash",
    "'; DROP TABLE comb.messages; --",
    "\" OR 1=1 --",
    "x'); DELETE FROM comb.queues; --",
    "%00",
    "%FF",
    "\u{0}",
    "nul\u{0}inside",
    "line\nbreak",
    "tab\there",
    "\u{7f}",
    "é",
    "😀",
    "\u{202e}rtl",
    "${jndi:ldap://127.0.0.1/x}",
    "NaN",
    "null",
    "true",
    "-1",
    "1e309",
    "00000000-0000-0000-0000-000000000000",
    "FFFFFFFF-FFFF-FFFF-FFFF-FFFFFFFFFFFF",
    "not-a-uuid",
    "__QUEUE_MODE__",
    "2026-13-45T99:99:99Z",
    "now",
    "*",
    "\\x00",
];

/// Numbers at and past the edges of every integer type a server might parse into.
pub const HOSTILE_NUMBERS: &[&str] = &[
    "0",
    "-1",
    "1",
    "1.5",
    "-0",
    "1e308",
    "-1e308",
    "1e-320",
    "2147483647",
    "2147483648",
    "-2147483649",
    "4294967296",
    "9223372036854775807",
    "9223372036854775808",
    "-9223372036854775809",
    "18446744073709551615",
    "18446744073709551616",
    "123456789012345678901234567890",
];

fn pick_str(rng: &mut Rng, list: &[&'static str]) -> &'static str {
    list[rng.below(list.len() as u64) as usize]
}

fn hostile_value(rng: &mut Rng) -> Value {
    match rng.below(9) {
        0 => Value::Null,
        1 => Value::Bool(rng.chance(0.5)),
        2 | 3 => Value::String(pick_str(rng, HOSTILE_STRINGS).to_string()),
        4 => serde_json::from_str(pick_str(rng, HOSTILE_NUMBERS)).unwrap_or(Value::Null),
        5 => json!([]),
        6 => json!({}),
        7 => Value::String("x".repeat(1 + rng.below(70_000) as usize)),
        _ => {
            let mut v = json!(1);
            for _ in 0..(1 + rng.below(100)) {
                v = json!([v]);
            }
            v
        }
    }
}

/// Percent-encodes everything but unreserved characters, so any bytes fit in a path.
pub fn encode(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Cases generated from an OpenAPI document.
pub struct Generator {
    doc: Value,
    /// (method, path template, operation).
    operations: Vec<(String, String, Value)>,
    ctx: Context,
}

impl Generator {
    /// A generator for every operation of `doc`.
    pub fn new(doc: Value, ctx: Context) -> Generator {
        let mut operations = Vec::new();
        if let Some(paths) = doc["paths"].as_object() {
            for (path, item) in paths {
                if let Some(item) = item.as_object() {
                    for (method, op) in item {
                        if ["get", "post", "put", "delete", "patch"].contains(&method.as_str()) {
                            operations.push((method.to_uppercase(), path.clone(), op.clone()));
                        }
                    }
                }
            }
        }
        Generator {
            doc,
            operations,
            ctx,
        }
    }

    /// The operations found, as `METHOD path`.
    pub fn routes(&self) -> Vec<String> {
        self.operations
            .iter()
            .map(|(m, p, _)| format!("{m} {p}"))
            .collect()
    }

    fn resolve<'a>(&'a self, v: &'a Value) -> &'a Value {
        let mut v = v;
        for _ in 0..16 {
            let Some(r) = v.get("$ref").and_then(Value::as_str) else {
                return v;
            };
            let Some(ptr) = r.strip_prefix('#') else {
                return v;
            };
            match self.doc.pointer(ptr) {
                Some(target) => v = target,
                None => return v,
            }
        }
        v
    }

    /// A plausible value for `schema`; `name` is the member it is for (ids and names get
    /// real values from the context some of the time).
    fn instance(&self, schema: &Value, name: &str, rng: &mut Rng, depth: usize) -> Value {
        let schema = self.resolve(schema);
        if let Some(v) = self.context_value(name, rng) {
            return v;
        }
        if let Some(all) = schema["allOf"].as_array()
            && let Some(first) = all.first()
        {
            return self.instance(first, name, rng, depth);
        }
        for key in ["oneOf", "anyOf"] {
            if let Some(options) = schema[key].as_array()
                && !options.is_empty()
            {
                return self.instance(rng.pick(options), name, rng, depth);
            }
        }
        if let Some(c) = schema.get("const") {
            return c.clone();
        }
        if let Some(e) = schema["enum"].as_array()
            && !e.is_empty()
        {
            return rng.pick(e).clone();
        }
        let kind = match &schema["type"] {
            Value::String(t) => t.clone(),
            Value::Array(ts) => ts
                .iter()
                .filter_map(Value::as_str)
                .find(|t| *t != "null")
                .unwrap_or("null")
                .to_string(),
            _ if schema.get("properties").is_some() => "object".into(),
            _ => "any".into(),
        };
        match kind.as_str() {
            "object" => {
                let mut out = Map::new();
                let required: Vec<&str> = schema["required"]
                    .as_array()
                    .map(|r| r.iter().filter_map(Value::as_str).collect())
                    .unwrap_or_default();
                if let Some(props) = schema["properties"].as_object() {
                    for (k, s) in props {
                        if (required.contains(&k.as_str()) || rng.chance(0.5)) && depth < 8 {
                            out.insert(k.clone(), self.instance(s, k, rng, depth + 1));
                        }
                    }
                }
                Value::Object(out)
            }
            "array" => {
                let min = schema["minItems"].as_u64().unwrap_or(0).max(1);
                let n = min + rng.below(3);
                let items = &schema["items"];
                Value::Array(
                    (0..n)
                        .map(|_| self.instance(items, name, rng, depth + 1))
                        .collect(),
                )
            }
            "string" => Value::String(match schema["format"].as_str() {
                Some("uuid") => "01a203e0-b528-700a-8c77-b23c72da0d8e".into(),
                Some("date-time") => "2026-01-31T12:00:00Z".into(),
                _ => "fuzz".into(),
            }),
            "integer" | "number" => {
                let lo = schema["minimum"].as_i64().unwrap_or(0);
                let hi = schema["maximum"].as_i64().unwrap_or(lo + 10).min(lo + 100);
                json!(lo + rng.below((hi - lo + 1).max(1) as u64) as i64)
            }
            "boolean" => Value::Bool(rng.chance(0.5)),
            "null" => Value::Null,
            _ => json!({"n": rng.below(1000), "s": "payload"}),
        }
    }

    fn context_value(&self, name: &str, rng: &mut Rng) -> Option<Value> {
        let pool = match name {
            "queue" => &self.ctx.queues,
            "partition" => &self.ctx.partitions,
            "consumerGroup" => &self.ctx.groups,
            "partitionId" => &self.ctx.partition_ids,
            "leaseId" => &self.ctx.lease_ids,
            "transactionId" => &self.ctx.transaction_ids,
            _ => return None,
        };
        (!pool.is_empty() && rng.chance(0.8)).then(|| Value::String(rng.pick(pool).clone()))
    }

    /// Breaks a value in one place.
    fn mutate(&self, v: &mut Value, rng: &mut Rng) -> String {
        // Walk down to a random node, noting its JSON pointer.
        let mut pointer = String::new();
        let mut path = String::new();
        {
            let mut node: &Value = v;
            for _ in 0..rng.below(5) {
                let next = match node {
                    Value::Object(m) if !m.is_empty() => {
                        let keys: Vec<&String> = m.keys().collect();
                        let k = *rng.pick(&keys);
                        path.push_str(&format!(".{k}"));
                        pointer.push_str(&format!("/{}", k.replace('~', "~0").replace('/', "~1")));
                        m.get(k)
                    }
                    Value::Array(a) if !a.is_empty() => {
                        let i = rng.below(a.len() as u64) as usize;
                        path.push_str(&format!("[{i}]"));
                        pointer.push_str(&format!("/{i}"));
                        a.get(i)
                    }
                    _ => None,
                };
                match next {
                    Some(n) => node = n,
                    None => break,
                }
            }
        }
        let node = v
            .pointer_mut(&pointer)
            .expect("the pointer was just walked");
        match (rng.below(5), &mut *node) {
            (0, Value::Object(m)) if !m.is_empty() => {
                let keys: Vec<String> = m.keys().cloned().collect();
                let k = rng.pick(&keys).clone();
                m.remove(&k);
                format!("removed {path}.{k}")
            }
            (1, Value::Object(m)) => {
                let k = pick_str(rng, HOSTILE_STRINGS).to_string();
                let k = if k.is_empty() {
                    "unknownField".into()
                } else {
                    k
                };
                m.insert(k.clone(), hostile_value(rng));
                format!("added {path}.{k:?}")
            }
            (2, Value::Array(a)) => {
                if rng.chance(0.5) {
                    a.clear();
                    format!("emptied {path}")
                } else if let Some(first) = a.first().cloned() {
                    let n = 1 + rng.below(50) as usize;
                    a.extend(std::iter::repeat_n(first, n));
                    format!("repeated {path} x{n}")
                } else {
                    a.push(hostile_value(rng));
                    format!("added to {path}")
                }
            }
            _ => {
                *node = hostile_value(rng);
                format!("replaced {path}")
            }
        }
    }

    /// A path for a template, each `{param}` plausible or hostile.
    fn fill_path(&self, template: &str, op: &Value, rng: &mut Rng, hostile: bool) -> String {
        let mut out = template.to_string();
        for p in self.parameters(op) {
            if p["in"] != "path" {
                continue;
            }
            let name = p["name"].as_str().unwrap_or_default();
            let value = if hostile && rng.chance(0.7) {
                encode(pick_str(rng, HOSTILE_STRINGS))
            } else if hostile && rng.chance(0.3) {
                "%FF%FE".to_string()
            } else {
                match self.instance(&p["schema"], name, rng, 0) {
                    Value::String(s) => encode(&s),
                    other => encode(&other.to_string()),
                }
            };
            let value = if value.is_empty() {
                "%20".into()
            } else {
                value
            };
            out = out.replace(&format!("{{{name}}}"), &value);
        }
        out
    }

    fn parameters<'a>(&'a self, op: &'a Value) -> Vec<&'a Value> {
        op["parameters"]
            .as_array()
            .map(|ps| ps.iter().map(|p| self.resolve(p)).collect())
            .unwrap_or_default()
    }

    fn query(&self, op: &Value, rng: &mut Rng, hostile: bool) -> String {
        let mut pairs = Vec::new();
        for p in self.parameters(op) {
            if p["in"] != "query" || !rng.chance(0.5) {
                continue;
            }
            let name = p["name"].as_str().unwrap_or_default();
            let value = if hostile && rng.chance(0.5) {
                if rng.chance(0.5) {
                    encode(pick_str(rng, HOSTILE_STRINGS))
                } else {
                    pick_str(rng, HOSTILE_NUMBERS).to_string()
                }
            } else {
                match self.instance(&p["schema"], name, rng, 0) {
                    Value::String(s) => encode(&s),
                    other => encode(&other.to_string()),
                }
            };
            let value = if name == "wait" {
                "false".into()
            } else {
                value
            };
            pairs.push(format!("{name}={value}"));
        }
        if hostile && rng.chance(0.2) {
            pairs.push(
                rng.pick(&["unknownOption=1", "%zz=%zz", "=", "&&", "batch", "a=%FF"])
                    .to_string(),
            );
        }
        if pairs.is_empty() {
            String::new()
        } else {
            format!("?{}", pairs.join("&"))
        }
    }

    /// One generated case, plausible or (mostly) broken.
    pub fn case(&self, rng: &mut Rng) -> Case {
        let (method, template, op) = rng.pick(&self.operations);
        let hostile = rng.chance(0.85);
        let hostile_path = hostile && rng.chance(0.3);
        let path = self.fill_path(template, op, rng, hostile_path);
        let query = self.query(op, rng, hostile);
        let mut name = format!("{method} {template}");
        let body = match op["requestBody"]["content"]["application/json"]["schema"].as_object() {
            None => Body::None,
            Some(_) => {
                let schema = &op["requestBody"]["content"]["application/json"]["schema"];
                let mut v = self.instance(schema, "", rng, 0);
                if hostile {
                    for _ in 0..(1 + rng.below(2)) {
                        let what = self.mutate(&mut v, rng);
                        name.push_str(&format!(" ({what})"));
                    }
                }
                let mut bytes = serde_json::to_vec(&v).expect("JSON");
                if hostile && rng.chance(0.2) {
                    let what = mutate_bytes(&mut bytes, rng);
                    name.push_str(&format!(" ({what})"));
                }
                Body::Sized(bytes)
            }
        };
        Case {
            name,
            method: method.clone(),
            target: format!("{path}{query}"),
            body,
            expect: None,
        }
    }
}

fn mutate_bytes(bytes: &mut Vec<u8>, rng: &mut Rng) -> &'static str {
    match rng.below(6) {
        0 => {
            let cut = rng.below(bytes.len() as u64) as usize;
            bytes.truncate(cut);
            "truncated"
        }
        1 => {
            let at = rng.below(bytes.len() as u64 + 1) as usize;
            bytes.insert(at, 0xff);
            "invalid UTF-8 byte"
        }
        2 => {
            bytes.extend_from_slice(b"}]garbage");
            "trailing garbage"
        }
        3 => {
            let mut v = b"\xef\xbb\xbf".to_vec();
            v.append(bytes);
            *bytes = v;
            "byte order mark"
        }
        4 => {
            // A string with an invalid escape or a lone surrogate.
            *bytes = rng
                .pick(&[
                    &br#"{"items":[{"queue":"q","payload":"\ud800"}]}"#[..],
                    &br#"{"queue":"\x"}"#[..],
                    &br#"{"queue":"q","partition":"\u0000"}"#[..],
                ])
                .to_vec();
            "bad escape"
        }
        _ => {
            bytes.clear();
            "empty"
        }
    }
}

fn nested(depth: usize) -> Vec<u8> {
    let mut s = Vec::with_capacity(depth * 2 + 1);
    s.extend(std::iter::repeat_n(b'[', depth));
    s.push(b'1');
    s.extend(std::iter::repeat_n(b']', depth));
    s
}

/// The hand-written cases: limits, nesting, methods, names, ids.
pub fn edge_cases(max_body: usize, ctx: &Context) -> Vec<Case> {
    let post = |name: &str, target: &str, body: Body, expect: Option<u16>| Case {
        name: name.to_string(),
        method: "POST".into(),
        target: target.to_string(),
        body,
        expect,
    };
    let mut out = Vec::new();
    let big = {
        // A valid JSON start, then one string past the limit.
        let mut b = br#"{"items":[{"queue":"q","payload":""#.to_vec();
        b.extend(std::iter::repeat_n(b'x', max_body + 1));
        b.extend_from_slice(br#""}]}"#);
        b
    };
    for route in [
        "/api/v1/push",
        "/api/v1/pop",
        "/api/v1/ack",
        "/api/v1/ack/batch",
        "/api/v1/transaction",
        "/api/v1/configure",
        "/api/v1/lease/00000000-0000-0000-0000-000000000000/extend",
    ] {
        out.push(post(
            &format!("{route}: body past the limit (Content-Length)"),
            route,
            Body::Sized(big.clone()),
            Some(413),
        ));
        out.push(post(
            &format!("{route}: body past the limit (chunked)"),
            route,
            Body::Chunked(big.clone()),
            Some(413),
        ));
        for (what, body) in [
            ("empty body", Vec::new()),
            ("truncated JSON", b"{\"items\": [{\"queue\"".to_vec()),
            (
                "invalid UTF-8",
                vec![b'{', b'"', 0xff, 0xfe, b'"', b':', b'1', b'}'],
            ),
            ("JSON null", b"null".to_vec()),
            ("JSON array", b"[]".to_vec()),
            ("JSON string", b"\"items\"".to_vec()),
            ("nested 200 deep", nested(200)),
            ("nested 100000 deep", nested(100_000)),
        ] {
            out.push(post(
                &format!("{route}: {what}"),
                route,
                Body::Sized(body),
                Some(400),
            ));
        }
        {
            // Which of two equal keys counts is the server's choice; it must not break.
            let body = br#"{"queue":"fuzz-edge","queue":"x y"}"#.to_vec();
            out.push(post(
                &format!("{route}: duplicate keys"),
                route,
                Body::Sized(body),
                None,
            ));
        }
        for method in ["PUT", "DELETE", "PATCH"] {
            out.push(Case {
                name: format!("{method} {route}"),
                method: method.into(),
                target: route.to_string(),
                body: Body::None,
                expect: Some(405),
            });
        }
    }
    let item = json!({"queue": "fuzz-edge", "payload": 1});
    let items: Vec<Value> = std::iter::repeat_n(item, 100_000).collect();
    out.push(post(
        "push of 100,000 items",
        "/api/v1/push",
        Body::Sized(serde_json::to_vec(&json!({ "items": items })).expect("JSON")),
        Some(413),
    ));
    let ack = json!({"transactionId": "t", "partitionId": "00000000-0000-0000-0000-000000000000", "status": "completed"});
    let acks: Vec<Value> = std::iter::repeat_n(ack.clone(), 100_000).collect();
    out.push(post(
        "ack batch of 100,000 items",
        "/api/v1/ack/batch",
        Body::Sized(serde_json::to_vec(&json!({ "acknowledgments": acks })).expect("JSON")),
        Some(413),
    ));
    let op = json!({"type": "push", "items": [{"queue": "fuzz-edge", "payload": 1}]});
    let ops: Vec<Value> = std::iter::repeat_n(op, 100_000).collect();
    out.push(post(
        "transaction of 100,000 operations",
        "/api/v1/transaction",
        Body::Sized(serde_json::to_vec(&json!({ "operations": ops })).expect("JSON")),
        Some(413),
    ));
    let deep = String::from_utf8(nested(100_000)).expect("ASCII");
    // Payloads are stored as sent; whether such a payload is taken is the server's choice,
    // but it must not break it, nor the pops that hand it out (below, on the same queue).
    out.push(post(
        "payload nested 100,000 deep",
        "/api/v1/push",
        Body::Sized(
            format!(r#"{{"items":[{{"queue":"fuzz-edge","payload":{deep}}}]}}"#).into_bytes(),
        ),
        None,
    ));
    for n in HOSTILE_NUMBERS {
        for (route, body) in [
            (
                "/api/v1/pop",
                format!(r#"{{"queue":"fuzz-edge","batch":{n}}}"#),
            ),
            (
                "/api/v1/pop",
                format!(r#"{{"queue":"fuzz-edge","timeout":{n},"wait":false}}"#),
            ),
            (
                "/api/v1/configure",
                format!(r#"{{"queue":"fuzz-edge","options":{{"leaseTime":{n}}}}}"#),
            ),
            (
                "/api/v1/configure",
                format!(r#"{{"queue":"fuzz-edge","options":{{"maxSize":{n}}}}}"#),
            ),
            (
                "/api/v1/lease/00000000-0000-0000-0000-000000000000/extend",
                format!(r#"{{"seconds":{n}}}"#),
            ),
        ] {
            out.push(post(
                &format!("{route} with number {n}"),
                route,
                Body::Sized(body.into_bytes()),
                None,
            ));
        }
        out.push(Case {
            name: format!("GET pop with batch={n}"),
            method: "GET".into(),
            target: format!("/api/v1/pop/queue/fuzz-edge?batch={n}&timeout={n}"),
            body: Body::None,
            expect: None,
        });
    }
    for s in HOSTILE_STRINGS {
        let e = encode(s);
        let e = if e.is_empty() { "%20".to_string() } else { e };
        for target in [
            format!("/api/v1/pop/queue/{e}"),
            format!("/api/v1/pop/queue/fuzz-edge/partition/{e}"),
            format!("/api/v1/pop/queue/fuzz-edge?consumerGroup={e}"),
            format!("/api/v1/pop/queue/fuzz-edge?subscriptionFrom={e}"),
            format!("/api/v1/pop/queue/fuzz-edge?subscriptionMode={e}&wait={e}&autoAck={e}"),
        ] {
            out.push(Case {
                name: format!("GET {target}"),
                method: "GET".into(),
                target,
                body: Body::None,
                expect: None,
            });
        }
        let body = |v: Value| Body::Sized(serde_json::to_vec(&v).expect("JSON"));
        out.push(post(
            &format!("extend lease {s:?}"),
            &format!("/api/v1/lease/{e}/extend"),
            body(json!({"seconds": 10})),
            None,
        ));
        let valid_name = !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._:-".contains(&b));
        out.push(post(
            &format!("push to queue {s:?}"),
            "/api/v1/push",
            body(json!({"items": [{"queue": s, "payload": 1}]})),
            Some(if valid_name { 201 } else { 400 }),
        ));
        out.push(post(
            &format!("push to partition {s:?}"),
            "/api/v1/push",
            body(json!({"items": [{"queue": "fuzz-edge", "partition": s, "payload": s, "transactionId": s, "traceId": s}]})),
            None,
        ));
        out.push(post(
            &format!("ack with ids {s:?}"),
            "/api/v1/ack",
            body(json!({"transactionId": s, "partitionId": s, "leaseId": s, "status": s, "consumerGroup": s})),
            None,
        ));
        out.push(post(
            &format!("configure with option value {s:?}"),
            "/api/v1/configure",
            body(json!({"queue": "fuzz-edge", "options": {"retryDelay": s}})),
            Some(400),
        ));
        if let Some(pid) = ctx.partition_ids.first() {
            out.push(post(
                &format!("ack a real partition with lease {s:?}"),
                "/api/v1/ack",
                body(json!({"transactionId": ctx.transaction_ids.first(), "partitionId": pid, "leaseId": s, "status": "completed"})),
                None,
            ));
        }
    }
    out.push(post(
        "ack of a transaction id holding a NUL character",
        "/api/v1/ack",
        Body::Sized(
            br#"{"transactionId":"a\u0000b","partitionId":"00000000-0000-0000-0000-000000000000","status":"completed"}"#.to_vec(),
        ),
        None,
    ));
    // A full queue: a push to a new partition must be refused without creating it.
    out.push(post(
        "configure a queue that holds one message",
        "/api/v1/configure",
        Body::Sized(br#"{"queue":"fuzz-full","options":{"maxSize":1}}"#.to_vec()),
        Some(200),
    ));
    out.push(post(
        "fill it",
        "/api/v1/push",
        Body::Sized(br#"{"items":[{"queue":"fuzz-full","partition":"a","payload":1}]}"#.to_vec()),
        Some(201),
    ));
    out.push(post(
        "push to the full queue through a new partition",
        "/api/v1/push",
        Body::Sized(br#"{"items":[{"queue":"fuzz-full","partition":"b","payload":1}]}"#.to_vec()),
        Some(429),
    ));
    out.push(post(
        "configure with an unknown option",
        "/api/v1/configure",
        Body::Sized(br#"{"queue":"fuzz-edge","options":{"priority":1}}"#.to_vec()),
        Some(400),
    ));
    out.push(post(
        "ack with an unknown status",
        "/api/v1/ack",
        Body::Sized(br#"{"transactionId":"t","partitionId":"00000000-0000-0000-0000-000000000000","status":"done"}"#.to_vec()),
        Some(400),
    ));
    out.push(post(
        "transaction with an unknown operation",
        "/api/v1/transaction",
        Body::Sized(br#"{"operations":[{"type":"drop","queue":"x"}]}"#.to_vec()),
        Some(400),
    ));
    for lease in ctx.lease_ids.iter().take(1) {
        out.push(post(
            "extend a real lease by 10 years",
            &format!("/api/v1/lease/{lease}/extend"),
            Body::Sized(br#"{"seconds":315360000}"#.to_vec()),
            Some(400),
        ));
    }
    out.push(Case {
        name: "unknown route".into(),
        method: "GET".into(),
        target: "/api/v1/nothing/here".into(),
        body: Body::None,
        expect: Some(404),
    });
    out
}

/// Defects found by this suite that wait for a fix in the server, each with the text that
/// identifies its findings. They are reported but do not fail a run, so that the suite keeps
/// guarding everything else meanwhile; `docs/reliability.md` describes each one. Remove an
/// entry once the server is fixed.
pub const KNOWN_DEFECTS: &[(&str, &str)] = &[];

/// The outcome of a fuzz run.
#[derive(Debug, Default)]
pub struct FuzzReport {
    pub cases: usize,
    /// Findings of [`KNOWN_DEFECTS`]: how many cases hit each.
    pub known: BTreeMap<&'static str, usize>,
    /// Answers by status.
    pub statuses: BTreeMap<u16, usize>,
    /// What went wrong, one line per case.
    pub findings: Vec<String>,
    pub elapsed: Duration,
}

impl FuzzReport {
    /// Records a finding, or counts it under its known defect.
    pub fn note(&mut self, finding: String) {
        match KNOWN_DEFECTS
            .iter()
            .find(|(text, _)| finding.contains(text))
        {
            Some((_, defect)) => *self.known.entry(defect).or_default() += 1,
            None => self.findings.push(finding),
        }
    }

    /// A few lines for people.
    pub fn summary(&self) -> String {
        let mut s = format!(
            "{} cases in {:.0} s; statuses {:?}; {} findings\n",
            self.cases,
            self.elapsed.as_secs_f64(),
            self.statuses,
            self.findings.len()
        );
        for (defect, n) in &self.known {
            s.push_str(&format!("known defect ({n} cases): {defect}\n"));
        }
        for f in self.findings.iter().take(40) {
            s.push_str(&format!("FINDING: {f}\n"));
        }
        s
    }
}

/// A fingerprint of everything a request could store. A refused request must not change it.
pub const FINGERPRINT_SQL: &str = "SELECT concat_ws(' ',
    (SELECT count(*) FROM comb.messages),
    (SELECT count(*) FROM comb.partitions),
    (SELECT count(*) FROM comb.queues),
    (SELECT count(*) FROM comb.subscriptions),
    (SELECT count(*) FROM comb.cursors),
    (SELECT coalesce(sum(cursor_pos), 0) FROM comb.cursors_now),
    (SELECT count(*) FROM comb.cursors_now WHERE lease_id IS NOT NULL),
    (SELECT md5(coalesce(string_agg(lease_id::text || coalesce(lease_expires_at::text, ''), ',' ORDER BY lease_id), '')) FROM comb.cursors_now),
    (SELECT count(*) FROM comb.dead_letters),
    (SELECT md5(coalesce(string_agg(name || options::text, ',' ORDER BY name), '')) FROM comb.queues))";

/// The HS256 secret of a server fuzzed with tokens.
pub const TOKEN_SECRET: &str = "comb-audit-fuzz-secret-of-more-than-32-bytes";

/// `Authorization` headers for a server that requires tokens: a valid administrator's, and
/// broken ones that must all be refused the same way.
pub struct Tokens {
    /// `Bearer <a valid admin token>`.
    pub valid: Vec<u8>,
    pub broken: Vec<(&'static str, Vec<u8>)>,
}

impl Tokens {
    /// Headers for a server verifying HS256 tokens with [`TOKEN_SECRET`].
    pub fn new() -> Tokens {
        use base64::Engine as _;
        let b64 = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock after 1970")
            .as_secs();
        let sign = |claims: Value, secret: &str| {
            jsonwebtoken::encode(
                &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
                &claims,
                &jsonwebtoken::EncodingKey::from_secret(secret.as_bytes()),
            )
            .expect("token")
        };
        let claims = json!({"sub": "fuzz", "role": "admin", "exp": now + 86_400});
        let valid = sign(claims.clone(), TOKEN_SECRET);
        let bearer = |t: &str| format!("Bearer {t}").into_bytes();
        let mut expired = claims.clone();
        expired["exp"] = json!(now - 3_600);
        let none = format!(
            "{}.{}.",
            b64(br#"{"alg":"none","typ":"JWT"}"#),
            b64(claims.to_string().as_bytes())
        );
        let mut tampered = valid.clone();
        tampered.pop();
        tampered.push(if valid.ends_with('A') { 'B' } else { 'A' });
        Tokens {
            broken: vec![
                ("empty bearer", b"Bearer ".to_vec()),
                ("other scheme", format!("Basic {valid}").into_bytes()),
                ("garbage", bearer("not.a.token")),
                ("expired", bearer(&sign(expired, TOKEN_SECRET))),
                (
                    "wrong key",
                    bearer(&sign(claims, "another-secret-of-more-than-32-bytes!!")),
                ),
                ("alg none", bearer(&none)),
                ("tampered", bearer(&tampered)),
                ("long", bearer(&"x".repeat(6_000))),
                ("not utf-8", b"Bearer \xff\xfe\x80token".to_vec()),
            ],
            valid: bearer(&valid),
        }
    }
}

impl Default for Tokens {
    fn default() -> Tokens {
        Tokens::new()
    }
}

/// Routes that answer without a token.
fn is_public(target: &str) -> bool {
    let path = target.split('?').next().unwrap_or(target);
    matches!(path, "/health" | "/ready" | "/metrics")
}

/// Runs `cases` generated cases (after the hand-written ones) against the server at `addr`,
/// checking the database at `database_url` around every refused request. With `tokens`,
/// four cases in five carry the valid token and the others a broken one.
pub async fn run(
    addr: SocketAddr,
    database_url: &str,
    cases: usize,
    seed: u64,
    max_body: usize,
    tokens: Option<&Tokens>,
) -> Result<FuzzReport, String> {
    let started = Instant::now();
    let (db, conn) = tokio_postgres::connect(database_url, tokio_postgres::NoTls)
        .await
        .map_err(|e| format!("database: {e}"))?;
    tokio::spawn(conn);
    let fingerprint = || async {
        db.query_one(FINGERPRINT_SQL, &[])
            .await
            .map(|r| r.get::<_, String>(0))
            .map_err(|e| format!("fingerprint: {e}"))
    };
    let valid = tokens.map(|t| t.valid.as_slice());
    let ctx = seed_context(addr, valid).await?;
    let doc_answer = send_with(
        addr,
        &Case {
            name: "openapi".into(),
            method: "GET".into(),
            target: "/api/v1/openapi.json".into(),
            body: Body::None,
            expect: Some(200),
        },
        valid,
    )
    .await
    .map_err(|e| format!("openapi: {e}"))?;
    let doc: Value =
        serde_json::from_slice(&doc_answer.body).map_err(|e| format!("openapi: {e}"))?;
    let generator = Generator::new(doc, ctx.clone());
    let mut rng = Rng::new(seed);
    let mut report = FuzzReport::default();
    let mut all = edge_cases(max_body, &ctx);
    for _ in 0..cases {
        all.push(generator.case(&mut rng));
    }
    for mut case in all {
        let before = fingerprint().await?;
        // Broken tokens go with small bodies only: a large one would be left unread.
        let small = match &case.body {
            Body::None => true,
            Body::Sized(b) => b.len() <= 4_096,
            Body::Chunked(_) => false,
        };
        let authorization = match tokens {
            Some(t) if small && rng.chance(0.2) => {
                let (what, header) = rng.pick(&t.broken);
                case.name = format!("{} with a token {what}", case.name);
                if !is_public(&case.target) {
                    case.expect = Some(401);
                }
                Some(header.as_slice())
            }
            Some(t) => Some(t.valid.as_slice()),
            None => None,
        };
        let answer = send_with(addr, &case, authorization).await;
        report.cases += 1;
        let answer = match answer {
            Ok(a) => a,
            Err(e) => {
                report
                    .findings
                    .push(format!("{}: no answer: {e}", case.name));
                continue;
            }
        };
        *report.statuses.entry(answer.status).or_default() += 1;
        if let Some(f) = judge(&case, &answer) {
            report.note(format!(
                "{} [{} {}]: {f}",
                case.name,
                case.method,
                trim(&case.target)
            ));
        }
        if (400..500).contains(&answer.status) {
            let after = fingerprint().await?;
            if after != before {
                report.note(format!(
                    "{} [{} {}]: refused with {} but the database changed ({before} -> {after}): {}",
                    case.name,
                    case.method,
                    trim(&case.target),
                    answer.status,
                    String::from_utf8_lossy(&answer.body[..answer.body.len().min(200)])
                ));
            }
        }
    }
    report.elapsed = started.elapsed();
    Ok(report)
}

fn trim(s: &str) -> &str {
    let mut cut = s.len().min(120);
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    &s[..cut]
}

/// Pushes a few messages and pops some with a lease, returning real names and ids.
async fn seed_context(addr: SocketAddr, token: Option<&[u8]>) -> Result<Context, String> {
    let mut headers = reqwest::header::HeaderMap::new();
    if let Some(t) = token {
        headers.insert(
            reqwest::header::AUTHORIZATION,
            reqwest::header::HeaderValue::from_bytes(t).map_err(|e| e.to_string())?,
        );
    }
    let http = reqwest::Client::builder()
        .default_headers(headers)
        .build()
        .map_err(|e| e.to_string())?;
    let base = format!("http://{addr}");
    let mut ctx = Context {
        queues: vec!["fuzz-q".into(), "fuzz.q:2".into()],
        partitions: vec!["Default".into(), "p-1".into()],
        groups: vec!["fuzz-g".into(), "__QUEUE_MODE__".into()],
        ..Context::default()
    };
    let items: Vec<Value> = (0..20)
        .map(|i| {
            json!({"queue": ctx.queues[i % 2], "partition": ctx.partitions[i % 2 ], "payload": {"i": i}, "transactionId": format!("fuzz-{i}")})
        })
        .collect();
    let r = http
        .post(format!("{base}/api/v1/push"))
        .json(&json!({ "items": items }))
        .send()
        .await
        .map_err(|e| format!("seed push: {e}"))?;
    if r.status().as_u16() != 201 {
        return Err(format!("seed push answered {}", r.status()));
    }
    for q in ["fuzz-q", "fuzz.q:2"] {
        let pop: Value = http
            .get(format!("{base}/api/v1/pop/queue/{q}?batch=3"))
            .send()
            .await
            .map_err(|e| format!("seed pop: {e}"))?
            .json()
            .await
            .unwrap_or(Value::Null);
        for m in pop["messages"].as_array().into_iter().flatten() {
            for (field, into) in [
                ("partitionId", &mut ctx.partition_ids),
                ("leaseId", &mut ctx.lease_ids),
                ("transactionId", &mut ctx.transaction_ids),
            ] {
                if let Some(s) = m[field].as_str()
                    && !into.iter().any(|x| x == s)
                {
                    into.push(s.to_string());
                }
            }
        }
    }
    Ok(ctx)
}

/// The largest body the fuzzed server accepts (its default).
pub const MAX_BODY: usize = 16 * 1024 * 1024;

/// Starts a server on `database_url` (long polls capped at 200 ms so waiting pops cannot slow
/// the run, background maintenance paused so it cannot change the database between two
/// fingerprints), fuzzes it, and checks that it is still running and healthy afterwards.
pub async fn against_new_server(
    comb: &std::path::Path,
    database_url: &str,
    cases: usize,
    seed: u64,
) -> Result<FuzzReport, String> {
    fuzz_new_server(comb, database_url, cases, seed, None).await
}

/// Like [`against_new_server`], with bearer tokens required (HS256, [`TOKEN_SECRET`]).
pub async fn against_new_server_with_tokens(
    comb: &std::path::Path,
    database_url: &str,
    cases: usize,
    seed: u64,
) -> Result<FuzzReport, String> {
    fuzz_new_server(comb, database_url, cases, seed, Some(&Tokens::new())).await
}

async fn fuzz_new_server(
    comb: &std::path::Path,
    database_url: &str,
    cases: usize,
    seed: u64,
    tokens: Option<&Tokens>,
) -> Result<FuzzReport, String> {
    let (bin, url) = (comb.to_path_buf(), database_url.to_string());
    let with_tokens = tokens.is_some();
    let server = tokio::task::spawn_blocking(move || {
        let mut env = vec![
            ("COMB_MAX_POLL_TIMEOUT_MS", "200"),
            ("COMB_MAINTENANCE_INTERVAL_MS", "86400000"),
        ];
        if with_tokens {
            env.extend([
                ("COMB_JWT_ENABLED", "true"),
                ("COMB_JWT_SECRET", TOKEN_SECRET),
            ]);
        }
        comb_harness::Server::start_with_env(&bin, &url, &[], &env)
    })
    .await
    .map_err(|e| e.to_string())?
    .map_err(|e| format!("comb: {e}"))?;
    let mut report = run(server.addr(), database_url, cases, seed, MAX_BODY, tokens).await?;
    if !crate::scenario::alive(server.pid()) {
        report
            .findings
            .push(format!("the server exited: {}", server.log_tail(20)));
    } else {
        let health = send(
            server.addr(),
            &Case {
                name: "health".into(),
                method: "GET".into(),
                target: "/health".into(),
                body: Body::None,
                expect: Some(200),
            },
        )
        .await;
        if health.map(|a| a.status).ok() != Some(200) {
            report
                .findings
                .push("the server is unhealthy after the run".into());
        }
    }
    if let Some(line) = server
        .log_tail(1_000_000)
        .lines()
        .find(|l| l.contains("panicked"))
    {
        report.findings.push(format!("the server panicked: {line}"));
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(status: u16, ct: &str, body: &str) -> Answer {
        Answer {
            status,
            headers: vec![("content-type".into(), ct.into())],
            body: body.as_bytes().to_vec(),
        }
    }

    fn case() -> Case {
        Case {
            name: "c".into(),
            method: "GET".into(),
            target: "/".into(),
            body: Body::None,
            expect: None,
        }
    }

    #[test]
    fn judge_accepts_only_complete_problems() {
        let good = r#"{"type":"urn:x","title":"Bad Request","status":400,"detail":"d","code":"c","error":"d"}"#;
        assert_eq!(
            judge(&case(), &answer(400, "application/problem+json", good)),
            None
        );
        assert!(judge(&case(), &answer(400, "text/plain", good)).is_some());
        let wrong_status = good.replace("400", "404");
        assert!(
            judge(
                &case(),
                &answer(400, "application/problem+json", &wrong_status)
            )
            .is_some()
        );
        let no_code = good.replace(r#""code":"c""#, r#""code":"""#);
        assert!(judge(&case(), &answer(400, "application/problem+json", &no_code)).is_some());
        assert!(judge(&case(), &answer(500, "application/problem+json", good)).is_some());
        assert_eq!(judge(&case(), &answer(201, "application/json", "[]")), None);
        let mut expecting = case();
        expecting.expect = Some(413);
        assert!(judge(&expecting, &answer(400, "application/problem+json", good)).is_some());
    }

    #[test]
    fn answers_parse_with_and_without_chunking() {
        let a = parse_answer(b"HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\n[]").unwrap();
        assert_eq!((a.status, a.body.as_slice()), (201, &b"[]"[..]));
        let a = parse_answer(
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\n{}\r\n1\r\n \r\n0\r\n\r\n",
        )
        .unwrap();
        assert_eq!(a.body, b"{} ");
    }

    #[test]
    fn generated_cases_follow_the_document_and_break_it() {
        let doc = json!({
            "paths": {
                "/q/{queue}": {"get": {"parameters": [
                    {"name": "queue", "in": "path", "schema": {"$ref": "#/components/schemas/Name"}},
                    {"name": "batch", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 5}}
                ]}},
                "/push": {"post": {"requestBody": {"content": {"application/json": {"schema": {
                    "type": "object", "required": ["items"],
                    "properties": {"items": {"type": "array", "minItems": 1, "items": {
                        "type": "object", "required": ["queue"],
                        "properties": {"queue": {"$ref": "#/components/schemas/Name"}, "n": {"type": "integer"}}
                    }}}
                }}}}}}
            },
            "components": {"schemas": {"Name": {"type": "string"}}}
        });
        let g = Generator::new(doc, Context::default());
        assert_eq!(g.routes().len(), 2);
        let mut rng = Rng::new(7);
        let mut saw_post = false;
        let mut saw_get = false;
        for _ in 0..200 {
            let c = g.case(&mut rng);
            match c.method.as_str() {
                "POST" => {
                    saw_post = true;
                    assert!(matches!(c.body, Body::Sized(_)));
                }
                _ => {
                    saw_get = true;
                    assert!(c.target.starts_with("/q/"), "{}", c.target);
                    assert!(!c.target.contains('{'), "{}", c.target);
                }
            }
        }
        assert!(saw_post && saw_get);
        // An unmutated instance satisfies the schema's shape.
        let schema = json!({"$ref": "#/components/schemas/Name"});
        assert!(g.instance(&schema, "x", &mut rng, 0).is_string());
    }

    #[test]
    fn encoding_keeps_only_unreserved_bytes() {
        assert_eq!(encode("a b/é'"), "a%20b%2F%C3%A9%27");
        assert_eq!(encode("A-z_0.~"), "A-z_0.~");
    }
}
