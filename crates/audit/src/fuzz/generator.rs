//! Requests generated from an OpenAPI description: a plausible instance of each operation
//! (real names and ids some of the time), then broken on purpose.

use serde_json::{Map, Value, json};

use super::Context;
use super::hostile::{HOSTILE_NUMBERS, HOSTILE_STRINGS, hostile_value, pick_str};
use super::wire::{Body, Case, encode};
use crate::rng::Rng;

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

#[cfg(test)]
mod tests {
    use super::*;

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
}
