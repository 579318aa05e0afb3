//! `GET /api/v1/openapi.json`: the OpenAPI 3.1 description, generated from the request and
//! answer types of the handlers (`utoipa`) and checked against [`super::routes`]; the suite
//! (`tests/suite/contract.rs`) validates a real answer of every route against it.

use std::sync::LazyLock;

use axum::http::header;
use axum::response::IntoResponse;

use utoipa::openapi::schema::{ObjectBuilder, Schema, Type};
use utoipa::openapi::{OpenApi as Document, RefOr};
use utoipa::{Modify, OpenApi, PartialSchema, ToSchema};

use super::problem::ProblemBody;
use super::{ack, configure, health, lease, metrics, pop, push, streams, transaction};
use crate::code::Code;

/// The data path, probes and streams: every route whose handler is annotated with
/// `#[utoipa::path]`.
#[derive(OpenApi)]
#[openapi(
    paths(
        push::push,
        pop::pop_queue,
        pop::pop_partition,
        pop::pop_body,
        ack::ack_one,
        ack::ack_batch,
        transaction::transaction,
        lease::extend,
        configure::configure,
        streams::register,
        streams::cycle,
        streams::state_get,
        streams::list,
        health::health,
        health::ready,
        metrics::metrics,
        openapi,
    ),
    components(schemas(ProblemBody, Code)),
    modifiers(&Contract),
    info(
        title = "Comb",
        version = "1.0.0",
        description = "Comb stores messages in queues divided into partitions, in PostgreSQL. Producers push; consumer groups pop messages under a lease and acknowledge them, or acknowledge and push together in one transaction. Within a partition, messages are delivered in push order and a partition is leased to one consumer of a group at a time; delivery is at-least-once.\n\nRequest bodies are JSON (the `Content-Type` is not checked) and at most `COMB_MAX_BODY_BYTES` (16 MiB by default). Errors are `application/problem+json` (RFC 9457) with a stable `code`; 429 and 503 answers carry `Retry-After`. Any path not listed answers 404 with code `route_not_found`, and a listed path with another method answers 405 with code `method_not_allowed`.",
    ),
    servers((url = "http://127.0.0.1:6632")),
    tags(
        (name = "messages", description = "Push, pop, acknowledge, transactions and lease extension."),
        (name = "queues", description = "Queue configuration."),
        (name = "operations", description = "Probes and this document."),
        (name = "resources", description = "Queues, partitions, namespaces and tasks with their depth; clearing a queue."),
        (name = "consumer-groups", description = "Consumer group lag, leases, deletion, subscription and seeks."),
        (name = "admin-messages", description = "Messages as operators see them, and settling, retrying or dead-lettering one by hand."),
        (name = "dead-letters", description = "Requeue and purge of dead letters."),
        (name = "system", description = "Maintenance modes shared by every server."),
        (name = "traces", description = "Events consumers record on messages, kept by the day."),
        (name = "status", description = "Status, per-minute analytics and PostgreSQL's statistics."),
        (name = "streams", description = "Queen's streams SDK: queries, cycles committed in one transaction, operator state."),
    )
)]
pub(crate) struct ApiDoc;

/// The document as served: generated, with the administration's part
/// ([`super::admin_api::AdminApi`]) merged in and every operation given its problem answers.
pub(crate) static DOCUMENT: LazyLock<String> = LazyLock::new(|| {
    let mut doc = ApiDoc::openapi();
    doc.merge(super::admin_api::AdminApi::openapi());
    Contract.modify(&mut doc);
    serde_json::to_string(&doc).expect("the document serialises")
});

/// Serves the document as JSON.
#[utoipa::path(
    get,
    path = "/api/v1/openapi.json",
    tag = "operations",
    operation_id = "openapi",
    responses((status = 200, description = "This document.", body = Object))
)]
pub(crate) async fn openapi() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "application/json")],
        DOCUMENT.as_str(),
    )
}

impl PartialSchema for Code {
    fn schema() -> RefOr<Schema> {
        let mut description = String::from(
            "Stable machine-readable error code: clients branch on it; it never changes its \
             spelling or meaning.\n\n",
        );
        for c in Code::ALL {
            description.push_str(&format!("- `{}`: {}\n", c.as_str(), c.sentence()));
        }
        ObjectBuilder::new()
            .schema_type(Type::String)
            .enum_values(Some(Code::ALL.iter().map(|c| c.as_str())))
            .description(Some(description))
            .into()
    }
}

impl ToSchema for Code {}

/// What the attributes cannot say: the bearer scheme, and the problem answer every operation
/// may give for its 4XX and 5XX statuses.
struct Contract;

const BEARER: &str = "Required when the server runs with `--jwt-enabled` (or Queen's `JWT_ENABLED=true`) on every route but `/health`, `/ready` and, unless `--jwt-protect-metrics`, `/metrics`. A missing or invalid token gets 401 (`missing_token`, `invalid_token`) with `WWW-Authenticate: Bearer`; a role that may not use the route gets 403 (`forbidden`), a queue outside the token's scope 403 (`queue_forbidden`). Roles: `read-only` (GET reads), `write-only` (push), `read-write` (push, pop, ack, transaction, lease), `admin` (everything, including configure and deletions). See docs/security.md.";

impl Modify for Contract {
    fn modify(&self, doc: &mut Document) {
        use utoipa::openapi::header::HeaderBuilder;
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        use utoipa::openapi::{ContentBuilder, Ref, ResponseBuilder};

        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .bearer_format("JWT")
                    .description(Some(BEARER))
                    .build(),
            ),
        );
        let retry_after = HeaderBuilder::new()
            .schema(
                ObjectBuilder::new()
                    .schema_type(Type::Integer)
                    .minimum(Some(0)),
            )
            .description(Some("Seconds to wait before retrying (on 429 and 503)."))
            .build();
        let problem = ResponseBuilder::new()
            .description("Refused: problem details whose `code` says why (`docs/errors.md`).")
            .header("Retry-After", retry_after)
            .content(
                "application/problem+json",
                ContentBuilder::new()
                    .schema(Some(Ref::from_schema_name("Problem")))
                    .build(),
            )
            .build();
        components
            .responses
            .insert("Problem".to_string(), problem.into());
        for item in doc.paths.paths.values_mut() {
            let operations = [
                &mut item.get,
                &mut item.post,
                &mut item.put,
                &mut item.delete,
                &mut item.patch,
            ];
            for op in operations.into_iter().flatten() {
                for range in ["4XX", "5XX"] {
                    op.responses
                        .responses
                        .entry(range.to_string())
                        .or_insert_with(|| Ref::from_response_name("Problem").into());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;
    use std::collections::BTreeSet;

    fn document() -> Value {
        serde_json::from_str(&DOCUMENT).expect("valid JSON")
    }

    #[test]
    fn document_describes_exactly_the_routes_served() {
        let doc = document();
        assert_eq!(doc["openapi"].as_str().map(|v| &v[..3]), Some("3.1"));
        let mut documented = BTreeSet::new();
        for (path, item) in doc["paths"].as_object().expect("paths") {
            for method in item.as_object().expect("path item").keys() {
                if ["get", "post", "put", "delete", "patch"].contains(&method.as_str()) {
                    documented.insert((method.to_uppercase(), path.clone()));
                }
            }
        }
        let served: BTreeSet<(String, String)> = super::super::routes()
            .into_iter()
            .map(|(m, p, _)| (m.to_string(), p.to_string()))
            .collect();
        assert_eq!(documented, served);
    }

    /// `openapi.json` beside this file is the document as served, so that a change of the
    /// wire contract (a field renamed in a type, say) shows in review as a change of that file.
    #[test]
    fn the_checked_in_copy_is_the_document() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/http/openapi.json");
        let want =
            serde_json::to_string_pretty(&document()).expect("the document serialises") + "\n";
        if std::env::var_os("COMB_WRITE_DOCS").is_some() {
            std::fs::write(&path, &want).expect("openapi.json written");
        }
        let have = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            have == want,
            "src/http/openapi.json is not the generated document; write it again with\n    \
             COMB_WRITE_DOCS=1 cargo test -p comb --lib openapi"
        );
    }

    /// Every `$ref` points at a component the document has.
    #[test]
    fn every_reference_resolves() {
        fn walk(v: &Value, doc: &Value, bad: &mut Vec<String>) {
            match v {
                Value::Object(m) => {
                    if let Some(Value::String(r)) = m.get("$ref") {
                        let found = r
                            .strip_prefix('#')
                            .and_then(|pointer| doc.pointer(pointer))
                            .is_some();
                        if !found {
                            bad.push(r.clone());
                        }
                    }
                    m.values().for_each(|v| walk(v, doc, bad));
                }
                Value::Array(a) => a.iter().for_each(|v| walk(v, doc, bad)),
                _ => {}
            }
        }
        let doc = document();
        let mut bad = Vec::new();
        walk(&doc, &doc, &mut bad);
        assert!(bad.is_empty(), "unresolved: {bad:?}");
    }

    /// The problem schema's `code` lists every code, so a client generated from the document
    /// knows them all.
    #[test]
    fn the_problem_schema_lists_every_code() {
        let doc = document();
        let listed: BTreeSet<&str> = doc["components"]["schemas"]["Code"]["enum"]
            .as_array()
            .expect("an enum")
            .iter()
            .filter_map(Value::as_str)
            .collect();
        let all: BTreeSet<&str> = Code::ALL.iter().map(|c| c.as_str()).collect();
        assert_eq!(listed, all);
        assert_eq!(
            doc["components"]["schemas"]["Problem"]["properties"]["code"]["$ref"],
            "#/components/schemas/Code"
        );
    }
}
