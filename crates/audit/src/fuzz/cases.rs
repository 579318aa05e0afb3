//! The hand-written cases: bodies past the limit (sized and chunked), huge batches, deep
//! nesting, wrong methods, hostile names and ids.

use serde_json::{Value, json};

use super::Context;
use super::hostile::{HOSTILE_NUMBERS, HOSTILE_STRINGS};
use super::wire::{Body, Case, encode};

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
            // A lease extension may come without a body (Queen's clients send none): for
            // this unknown lease that is a 409, not a 400.
            let expected = if what == "empty body" && route.contains("/lease/") {
                409
            } else {
                400
            };
            out.push(post(
                &format!("{route}: {what}"),
                route,
                Body::Sized(body),
                Some(expected),
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
        Body::Sized(br#"{"queue":"fuzz-edge","options":{"priorty":1}}"#.to_vec()),
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
