//! The HTTP API v1: routing, shared state, and the edge where every request is validated.

mod ack;
pub(crate) mod admin_api;
mod body;
mod configure;
mod dead_letters;
mod dlq;
mod groups;
mod guard;
mod health;
mod lease;
/// Caps on connections and waiting pops.
pub(crate) mod limits;
mod messages;
mod metrics;
mod openapi;
mod params;
mod pop;
pub(crate) mod problem;
pub(crate) mod push;
/// Queue resources (deletion) and the catalog notification channel.
pub(crate) mod queues;
/// Sizes, depth and lag of queues, partitions, namespaces and tasks; clearing a queue.
mod resources;
mod status;
/// Queen's streams routes (the dashboard reads their listing's type).
pub(crate) mod streams;
mod system;
/// HTTPS on the listener.
pub(crate) mod tls;
mod traces;
mod transaction;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::http::Method;
use axum::routing::{MethodRouter, delete, get, post};
use deadpool_postgres::Pool;
use tokio::sync::watch;

pub(crate) use problem::Problem;

use crate::ack::Acker;
use crate::catalog::Catalog;
use crate::code::Code;
use crate::config::ServeConfig;
use crate::pop::Popper;
use crate::push::Pusher;
use crate::transaction::Transactions;
use crate::wake::Wake;

/// Everything a handler needs, shared by all requests.
pub(crate) struct App {
    pub(crate) config: ServeConfig,
    /// The storage the use cases run on, read once at start.
    pub(crate) backend: crate::backend::Backend,
    /// Where a partition's hot-path statements go (`--citus-route`), read once at start.
    pub(crate) router: crate::db::route::Router,
    /// The general pool (`pools.general`), what handlers draw from.
    pub(crate) pool: Pool,
    /// Both request pools, for their figures.
    pub(crate) pools: crate::db::Pools,
    pub(crate) catalog: Arc<Catalog>,
    pub(crate) wake: Arc<Wake>,
    /// The use cases: each owns its whole story, handlers call them.
    pub(crate) pusher: Arc<Pusher>,
    pub(crate) popper: Popper,
    pub(crate) acker: Arc<Acker>,
    pub(crate) transactions: Transactions,
    /// Queen's streams: queries, cycles, state.
    pub(crate) streams: crate::streams::Streams,
    /// This process's counters, served by `GET /metrics`.
    pub(crate) metrics: Arc<crate::metrics::Metrics>,
    /// Whether acknowledged writes would survive a failover, as last checked.
    pub(crate) replication: Arc<crate::replication::Status>,
    /// Set once SIGTERM arrived: `/ready` answers 503 and waiting pops answer 204.
    pub(crate) stopping: AtomicBool,
    /// Fires when `stopping` is set, to wake waiting pops.
    pub(crate) stop_signal: watch::Sender<bool>,
    /// How long requests took, one histogram per entry of [`routes`], in its order.
    pub(crate) durations: Vec<crate::metrics::Durations>,
    /// Maintenance modes as this server last read them.
    pub(crate) modes: Arc<crate::admin::modes::Modes>,
    /// When this server started.
    pub(crate) started: std::time::Instant,
    /// Keys that open the payloads of queues with `encryptionEnabled` (pushes seal them).
    pub(crate) keys: Arc<crate::encryption::Keys>,
    /// Token verification, when tokens are required (see [`crate::auth`]).
    pub(crate) auth: Option<Arc<crate::auth::Auth>>,
}

impl App {
    /// Begins a graceful stop: no new waits, waiting pops answer now.
    pub(crate) fn begin_stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        let _ = self.stop_signal.send(true);
        self.wake.notify_all();
    }

    /// Whether a graceful stop has begun.
    pub(crate) fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }
}

/// Handler state.
pub(crate) type State = Arc<App>;

/// Every route: method, path (OpenAPI syntax) and handler. The router and the OpenAPI
/// document are both checked against this one list, so they cannot drift apart.
pub(crate) fn routes() -> Vec<(Method, &'static str, MethodRouter<State>)> {
    vec![
        (Method::POST, "/api/v1/push", post(push::push)),
        (
            Method::GET,
            "/api/v1/pop/queue/{queue}",
            get(pop::pop_queue),
        ),
        (
            Method::GET,
            "/api/v1/pop/queue/{queue}/partition/{partition}",
            get(pop::pop_partition),
        ),
        (Method::POST, "/api/v1/pop", post(pop::pop_body)),
        (Method::POST, "/api/v1/ack", post(ack::ack_one)),
        (Method::POST, "/api/v1/ack/batch", post(ack::ack_batch)),
        (
            Method::POST,
            "/api/v1/transaction",
            post(transaction::transaction),
        ),
        (
            Method::POST,
            "/api/v1/lease/{leaseId}/extend",
            post(lease::extend),
        ),
        (
            Method::POST,
            "/api/v1/configure",
            post(configure::configure),
        ),
        (
            Method::DELETE,
            "/api/v1/resources/queues/{queue}",
            delete(queues::delete_queue),
        ),
        (
            Method::GET,
            "/api/v1/resources/overview",
            get(resources::overview),
        ),
        (
            Method::GET,
            "/api/v1/resources/queues",
            get(resources::queues),
        ),
        (
            Method::GET,
            "/api/v1/resources/queues/{queue}",
            get(resources::queue),
        ),
        (
            Method::GET,
            "/api/v1/resources/partitions",
            get(resources::partitions),
        ),
        (
            Method::GET,
            "/api/v1/resources/namespaces",
            get(resources::namespaces),
        ),
        (
            Method::GET,
            "/api/v1/resources/tasks",
            get(resources::tasks),
        ),
        (
            Method::DELETE,
            "/api/v1/queues/{queue}/clear",
            delete(resources::clear),
        ),
        (Method::GET, "/api/v1/consumer-groups", get(groups::list)),
        (
            Method::GET,
            "/api/v1/consumer-groups/lagging",
            get(groups::lagging),
        ),
        (
            Method::GET,
            "/api/v1/consumer-groups/{group}",
            get(groups::detail),
        ),
        (
            Method::DELETE,
            "/api/v1/consumer-groups/{group}/queues/{queue}",
            delete(groups::delete_for_queue),
        ),
        (
            Method::POST,
            "/api/v1/consumer-groups/{group}/subscription",
            post(groups::subscription),
        ),
        (
            Method::POST,
            "/api/v1/consumer-groups/{group}/queues/{queue}/seek",
            post(groups::seek),
        ),
        (
            Method::POST,
            "/api/v1/consumer-groups/{group}/queues/{queue}/partitions/{partition}/seek",
            post(groups::seek_partition),
        ),
        (Method::GET, "/api/v1/messages", get(messages::list)),
        (
            Method::GET,
            "/api/v1/messages/{partitionId}/{transactionId}",
            get(messages::get),
        ),
        (
            Method::DELETE,
            "/api/v1/messages/{partitionId}/{transactionId}",
            delete(messages::delete),
        ),
        (
            Method::POST,
            "/api/v1/messages/{partitionId}/{transactionId}/retry",
            post(messages::retry),
        ),
        (
            Method::POST,
            "/api/v1/messages/{partitionId}/{transactionId}/dlq",
            post(messages::dead_letter),
        ),
        (
            Method::POST,
            "/api/v1/dlq/requeue",
            post(dead_letters::requeue),
        ),
        (Method::POST, "/api/v1/dlq/purge", post(dead_letters::purge)),
        (
            Method::GET,
            "/api/v1/system/maintenance",
            get(system::get_push),
        ),
        (
            Method::POST,
            "/api/v1/system/maintenance",
            post(system::set_push),
        ),
        (
            Method::GET,
            "/api/v1/system/maintenance/pop",
            get(system::get_pop),
        ),
        (
            Method::POST,
            "/api/v1/system/maintenance/pop",
            post(system::set_pop),
        ),
        (Method::GET, "/api/v1/system/servers", get(system::servers)),
        (Method::POST, "/api/v1/traces", post(traces::record)),
        (Method::GET, "/api/v1/traces/names", get(traces::names)),
        (
            Method::GET,
            "/api/v1/traces/by-name/{traceName}",
            get(traces::by_name),
        ),
        (
            Method::GET,
            "/api/v1/traces/{partitionId}/{transactionId}",
            get(traces::of_message),
        ),
        (Method::GET, "/api/v1/status", get(status::status)),
        (Method::GET, "/api/v1/status/queues", get(status::queues)),
        (
            Method::GET,
            "/api/v1/status/queues/{queue}",
            get(status::queue),
        ),
        (
            Method::GET,
            "/api/v1/status/analytics",
            get(status::analytics),
        ),
        (
            Method::GET,
            "/api/v1/analytics/postgres-stats",
            get(status::postgres_stats),
        ),
        (
            Method::GET,
            "/api/v1/analytics/system-metrics",
            get(status::system_metrics),
        ),
        (
            Method::GET,
            "/api/v1/analytics/worker-metrics",
            get(status::worker_metrics),
        ),
        (Method::POST, "/api/v1/stats/refresh", post(status::refresh)),
        (Method::GET, "/api/v1/dlq", get(dlq::list)),
        (Method::POST, "/streams/v1/queries", post(streams::register)),
        (Method::POST, "/streams/v1/cycle", post(streams::cycle)),
        (
            Method::POST,
            "/streams/v1/state/get",
            post(streams::state_get),
        ),
        (Method::GET, "/api/v1/streams/queries", get(streams::list)),
        (Method::GET, "/health", get(health::health)),
        (Method::GET, "/ready", get(health::ready)),
        (Method::GET, "/metrics", get(metrics::metrics)),
        (Method::GET, "/api/v1/openapi.json", get(openapi::openapi)),
    ]
}

/// One empty duration histogram per route, for [`App::durations`].
pub(crate) fn route_durations() -> Vec<crate::metrics::Durations> {
    routes().iter().map(|_| Default::default()).collect()
}

/// The application router. Each route records how long its requests took.
pub(crate) fn router(state: State) -> Router {
    let mut router = Router::new();
    for (i, (_, path, handler)) in routes().into_iter().enumerate() {
        let app = state.clone();
        let timed = axum::middleware::from_fn(
            move |request: axum::extract::Request, next: axum::middleware::Next| {
                let app = app.clone();
                async move {
                    let start = std::time::Instant::now();
                    let response = next.run(request).await;
                    app.durations[i].observe(start.elapsed());
                    response
                }
            },
        );
        router = router.route(path, handler.route_layer(timed));
    }
    router = router
        .fallback(|| async { Problem::not_found(Code::RouteNotFound, "no such route") })
        .method_not_allowed_fallback(|| async {
            Problem::new(
                axum::http::StatusCode::METHOD_NOT_ALLOWED,
                Code::MethodNotAllowed,
                "this route does not accept that method",
            )
        });
    router = router.layer(axum::middleware::from_fn(refuse_nul_in_query));
    if let Some(auth) = state.auth.clone() {
        router = router.layer(axum::middleware::from_fn(move |request, next| {
            guard::guard(auth.clone(), request, next)
        }));
    }
    // Outermost: every answer, refusals of the layers above included, carries its id.
    router = router.layer(axum::middleware::from_fn(problem::with_request_id));
    router.with_state(state)
}

/// Refuses a query string carrying a NUL byte (`%00`) on every route: no name, id or filter
/// may hold one, and PostgreSQL text cannot.
async fn refuse_nul_in_query(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse as _;
    let nul = axum::http::Uri::query(request.uri()).is_some_and(|q| {
        q.as_bytes()
            .windows(3)
            .any(|w| w.eq_ignore_ascii_case(b"%00"))
    });
    if nul {
        return Problem::bad_request(
            Code::ParameterInvalid,
            "query parameters may not contain a NUL byte (%00)",
        )
        .into_response();
    }
    next.run(request).await
}
