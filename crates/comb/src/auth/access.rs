//! Which role each route needs, decided by method and path in one table, so that routes added
//! later get a sensible level without being listed: reads are `GET`, everything unknown is
//! for administrators.

use axum::http::Method;

/// What a route lets a caller do, from least to most trusted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    /// No token needed (health and readiness probes).
    Public,
    /// Reads that change nothing (listings, status, message browsing).
    Read,
    /// Pushes only.
    Produce,
    /// Pops, acks, transactions and leases: they change the state of consumers.
    Consume,
    /// Configuration, deletions and everything not otherwise known.
    Admin,
}

/// A role a token may carry (Queen's four).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Role {
    WriteOnly,
    ReadOnly,
    ReadWrite,
    Admin,
}

impl Role {
    /// Whether a token of this role may use a route needing `access`.
    pub(crate) fn allows(self, access: Access) -> bool {
        match access {
            Access::Public => true,
            Access::Read => matches!(self, Role::ReadOnly | Role::ReadWrite | Role::Admin),
            Access::Produce => matches!(self, Role::WriteOnly | Role::ReadWrite | Role::Admin),
            Access::Consume => matches!(self, Role::ReadWrite | Role::Admin),
            Access::Admin => self == Role::Admin,
        }
    }
}

/// Methods a rule applies to.
#[derive(Clone, Copy)]
enum Methods {
    /// `GET` and `HEAD`.
    Read,
    Post,
    Any,
}

/// The rules, first match wins. A pattern's `*` stands for one path segment, a trailing `**`
/// for any number (at least none). Anything matching no rule needs [`Access::Admin`].
const RULES: &[(Methods, &str, Access)] = &[
    (Methods::Read, "/health", Access::Public),
    (Methods::Read, "/ready", Access::Public),
    (Methods::Post, "/api/v1/push", Access::Produce),
    (Methods::Read, "/api/v1/pop/**", Access::Consume),
    (Methods::Post, "/api/v1/pop", Access::Consume),
    (Methods::Post, "/api/v1/ack", Access::Consume),
    (Methods::Post, "/api/v1/ack/batch", Access::Consume),
    (Methods::Post, "/api/v1/transaction", Access::Consume),
    (Methods::Post, "/api/v1/lease/*/extend", Access::Consume),
    // A streams cycle acks and pushes, like a transaction; registering a query and reading
    // its state belong to running it.
    (Methods::Post, "/streams/v1/**", Access::Consume),
    (Methods::Any, "/api/v1/configure", Access::Admin),
    // Which servers run, and which release each: a read, as the dashboard's overview shows it.
    (Methods::Read, "/api/v1/system/servers", Access::Read),
    (Methods::Any, "/api/v1/system/**", Access::Admin),
    (Methods::Any, "/api/v1/admin/**", Access::Admin),
    (Methods::Read, "/**", Access::Read),
];

/// What `method path` needs. `/metrics` is public unless `protect_metrics`.
pub(crate) fn required(method: &Method, path: &str, protect_metrics: bool) -> Access {
    if path == "/metrics" && (method == Method::GET || method == Method::HEAD) {
        return if protect_metrics {
            Access::Read
        } else {
            Access::Public
        };
    }
    RULES
        .iter()
        .find(|(methods, pattern, _)| applies(*methods, method) && matches(pattern, path))
        .map_or(Access::Admin, |r| r.2)
}

fn applies(methods: Methods, method: &Method) -> bool {
    match methods {
        Methods::Read => method == Method::GET || method == Method::HEAD,
        Methods::Post => method == Method::POST,
        Methods::Any => true,
    }
}

/// Whether `path` matches `pattern` (see [`RULES`]).
fn matches(pattern: &str, path: &str) -> bool {
    let mut want = pattern.split('/');
    let mut have = path.split('/');
    loop {
        match (want.next(), have.next()) {
            (Some("**"), _) => return true,
            (Some(w), Some(h)) if w == "*" && !h.is_empty() || w == h => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

/// Routes whose queues are named in the request body and checked by their handlers against
/// a token's queue scope (see [`crate::auth::Principal::may_use`]). Acks and lease extensions
/// name a partition or lease by the random id a pop of the caller's queues handed out.
const BODY_SCOPED: &[(Methods, &str)] = &[
    (Methods::Post, "/api/v1/push"),
    (Methods::Post, "/api/v1/pop"),
    (Methods::Post, "/api/v1/ack"),
    (Methods::Post, "/api/v1/ack/batch"),
    (Methods::Post, "/api/v1/transaction"),
    (Methods::Post, "/api/v1/lease/*/extend"),
    (Methods::Any, "/api/v1/configure"),
];

/// Where a request's queue is, for a token limited to some queues.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum QueueOf<'p> {
    /// Named in the path: the segment after `queue` or `queues`.
    Path(&'p str),
    /// Named in the body, checked by the handler.
    Body,
    /// The route spans queues (listings, system routes): not for limited tokens.
    Unknown,
}

/// Where the queue of `method path` is named.
pub(crate) fn queue_of<'p>(method: &Method, path: &'p str) -> QueueOf<'p> {
    let mut segments = path.split('/');
    while let Some(s) = segments.next() {
        if (s == "queue" || s == "queues")
            && let Some(name) = segments.next().filter(|n| !n.is_empty())
        {
            return QueueOf::Path(name);
        }
    }
    if BODY_SCOPED
        .iter()
        .any(|(methods, pattern)| applies(*methods, method) && matches(pattern, path))
    {
        QueueOf::Body
    } else {
        QueueOf::Unknown
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_route_class_has_its_level() {
        let cases = [
            (Method::GET, "/health", Access::Public),
            (Method::GET, "/ready", Access::Public),
            (Method::GET, "/metrics", Access::Public),
            (Method::POST, "/api/v1/push", Access::Produce),
            (Method::GET, "/api/v1/pop/queue/q", Access::Consume),
            (
                Method::GET,
                "/api/v1/pop/queue/q/partition/p",
                Access::Consume,
            ),
            (Method::POST, "/api/v1/pop", Access::Consume),
            (Method::POST, "/api/v1/ack", Access::Consume),
            (Method::POST, "/api/v1/ack/batch", Access::Consume),
            (Method::POST, "/api/v1/transaction", Access::Consume),
            (Method::POST, "/api/v1/lease/abc/extend", Access::Consume),
            (Method::POST, "/streams/v1/cycle", Access::Consume),
            (Method::GET, "/api/v1/streams/queries", Access::Read),
            (Method::POST, "/api/v1/configure", Access::Admin),
            (Method::DELETE, "/api/v1/resources/queues/q", Access::Admin),
            (Method::GET, "/api/v1/resources/queues", Access::Read),
            (Method::GET, "/api/v1/resources/queues/q", Access::Read),
            (Method::GET, "/api/v1/messages", Access::Read),
            (Method::GET, "/api/v1/dlq", Access::Read),
            (Method::POST, "/api/v1/dlq/requeue", Access::Admin),
            (Method::POST, "/api/v1/queues/q/purge", Access::Admin),
            (Method::GET, "/api/v1/consumer-groups", Access::Read),
            (
                Method::POST,
                "/api/v1/consumer-groups/g/seek",
                Access::Admin,
            ),
            (Method::GET, "/api/v1/status/queues/q", Access::Read),
            (Method::GET, "/api/v1/system/maintenance", Access::Admin),
            (Method::POST, "/api/v1/system/maintenance", Access::Admin),
            (Method::GET, "/api/v1/traces", Access::Read),
            (Method::GET, "/", Access::Read),
            (Method::GET, "/dashboard/queues", Access::Read),
            (Method::GET, "/api/v1/openapi.json", Access::Read),
            (Method::PUT, "/something/new", Access::Admin),
            (Method::PATCH, "/api/v1/push", Access::Admin),
            (Method::GET, "/api/v1/lease/x/extend", Access::Read),
        ];
        for (method, path, want) in cases {
            assert_eq!(required(&method, path, false), want, "{method} {path}");
        }
        assert_eq!(required(&Method::GET, "/metrics", true), Access::Read);
    }

    #[test]
    fn roles_allow_what_they_should() {
        use Access::*;
        let table = [
            (Role::WriteOnly, [true, false, true, false, false]),
            (Role::ReadOnly, [true, true, false, false, false]),
            (Role::ReadWrite, [true, true, true, true, false]),
            (Role::Admin, [true, true, true, true, true]),
        ];
        for (role, allowed) in table {
            for (access, want) in [Public, Read, Produce, Consume, Admin]
                .into_iter()
                .zip(allowed)
            {
                assert_eq!(role.allows(access), want, "{role:?} {access:?}");
            }
        }
    }

    #[test]
    fn the_queue_of_a_request_is_found() {
        assert_eq!(
            queue_of(&Method::GET, "/api/v1/pop/queue/orders/partition/p"),
            QueueOf::Path("orders")
        );
        assert_eq!(
            queue_of(&Method::DELETE, "/api/v1/resources/queues/orders"),
            QueueOf::Path("orders")
        );
        assert_eq!(queue_of(&Method::POST, "/api/v1/push"), QueueOf::Body);
        assert_eq!(queue_of(&Method::POST, "/api/v1/configure"), QueueOf::Body);
        assert_eq!(
            queue_of(&Method::GET, "/api/v1/resources/queues"),
            QueueOf::Unknown
        );
        assert_eq!(queue_of(&Method::GET, "/api/v1/system/x"), QueueOf::Unknown);
    }
}
